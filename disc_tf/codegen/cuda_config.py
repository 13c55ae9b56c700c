"""Launch configuration of the CUDA kernels: block size, grid limits and the
row lengths and sizes at which the host runner switches versions."""

#: Kernel kinds this backend generates.
KINDS = ("loop", "stitch", "reduce", "library")
#: Threads per block of every launch.
BLOCK = 256
#: Most blocks of a grid-stride launch.
MAX_GRID = 65535
#: Rows up to this length run one warp per row, longer ones one block per row.
WARP_ROW_MAX = 1024
#: ... unless there are fewer rows than this: then one block per row, for more threads
#: in flight (0: never; 2112 is 16 rows per SM of a 132-SM H200). On the H200, BERT-base's
#: 1000 layer-norm rows of 768 floats ran in 24 us as 125 blocks of 8 warps, in 10.5-11 us
#: as 1000 blocks (GPU replay, --variants ';WARP_ROWS_MIN=...' races the two).
WARP_ROWS_MIN = 2112
#: Reduce kernels with at least this many outputs run one thread per output.
THREAD_REDUCE_MIN = 2048
#: Broadcasting loop kernels run one block per row from this row length on ...
ROWS_MIN_INNER = 128
#: ... when there are this many rows (2 blocks per SM of a 132-SM GPU, about): fewer
#: rows run per element, or a merge of dims to one long row would run in one block.
BCAST_ROWS_MIN = 256
#: Most dynamic shared memory a stitch kernel uses to cache its row (the
#: default limit of every GPU since sm_20, no opt-in needed).
ROW_CACHE_BYTES = 48 * 1024
#: Bytes of each compute type (row caches hold compute-type values).
ITEMSIZE_COMPUTE = {"float": 4, "int32_t": 4, "int64_t": 8, "bool": 1}
#: Elements per thread of the vectorized loop version.
VEC = 4
#: A reduce kernel with fewer outputs than this many blocks, over at least
#: SPLIT_REDUCE_MIN elements each, splits each output's elements over several blocks
#: (ranges of about SPLIT_REDUCE_CHUNK elements) instead of one block per output: a
#: full reduction of 34 M elements in one block took 94 ms on an H200.
SPLIT_REDUCE_BLOCKS = 1024
SPLIT_REDUCE_MIN = 1 << 15
SPLIT_REDUCE_CHUNK = 1 << 13
