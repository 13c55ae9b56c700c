/* disc_ral.h -- the runtime abstraction layer (RAL) between generated cluster
 * code and its host (TensorFlow's DiscCluster kernel, or any other embedder).
 *
 * Generated artifacts include this header and nothing from TensorFlow. The host
 * passes one `disc_ral` table per call; every service (inputs, output and temp
 * allocation, the intra-op thread pool, error reporting) is a function pointer
 * in it, so an artifact has no undefined symbols to resolve against the host
 * and loads with RTLD_LOCAL next to any TensorFlow build.
 *
 * An artifact (a shared object) exports, with C linkage:
 *   int32_t disc_abi_version(void);        returns DISC_RAL_ABI_VERSION
 *   int32_t disc_num_kernels(void);        generated kernels in this artifact
 *   int32_t disc_entry(disc_ral* ral);     runs the cluster once; 0 on success,
 *                                          otherwise an error was set with
 *                                          ral->set_error and outputs are void.
 */
#ifndef DISC_RAL_H_
#define DISC_RAL_H_

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DISC_RAL_ABI_VERSION 12

/* Error codes: the numeric values of TensorFlow's error codes. */
enum {
  DISC_OK = 0,
  DISC_INVALID_ARGUMENT = 3,
  DISC_RESOURCE_EXHAUSTED = 8,
  DISC_INTERNAL = 13,
};

/* Element types: the numeric values of TensorFlow's DataType enum. */
enum {
  DISC_F32 = 1,
  DISC_I32 = 3,
  DISC_I64 = 9,
  DISC_BOOL = 10,
  DISC_BF16 = 14,
  DISC_F16 = 19,
};

/* A [begin, end) slice of a parallel loop; `closure` is the caller's data. */
typedef void (*disc_range_fn)(void* closure, int64_t begin, int64_t end);

/* The epilogue of a GEMM: runs on rows [i0, i1) and columns [j0, j1) of product q
 * of C once that block is final. */
typedef void (*disc_gemm_epilogue_fn)(void* closure, int64_t q, int64_t i0,
                                      int64_t i1, int64_t j0, int64_t j1);

/* A block of C held in scratch (ABI 7): rows [i0, i1) of product q, all n columns,
 * at c with row stride ldc; valid only during the call. */
typedef void (*disc_gemm_scratch_fn)(void* closure, int64_t q, int64_t i0, int64_t i1,
                                     float* c, int64_t ldc);

/* Rows [i0, i1) of a GEMM's A made on demand (ABI 8): row i's k floats written at
 * dst + (i - i0) * k. */
typedef void (*disc_gemm_gather_fn)(void* closure, int64_t i0, int64_t i1, float* dst);

/* The columns of C that rows [i0, i1) of product q need (ABI 9): a count in
 * [0, n]; the block's later columns are never read but through a select that
 * takes its other arm there (a causal or padding mask's false columns). */
typedef int64_t (*disc_gemm_cols_fn)(void* closure, int64_t q, int64_t i0, int64_t i1);

/* ABI 11. An epilogue the RAL's GEMM blocks can run on C's registers: element (i, j)
 * of product q, at e = (q * rows + i) * cols + j of C, becomes
 *   x = step[0](x), x = step[1](x), ...
 * written at out[e] (out may be c). A step is one op between x and column j's element
 * of `operand` (n floats), element e of `operand` (laid out as C: a residual), or
 * `constant`; `value_first` says whether x is the op's first operand, which decides a
 * maximum's or minimum's NaN and signed zero (the generated kernels' disc_max and
 * disc_min). */
enum {
  DISC_COLUMN_MUL = 1,      /* x * column[j] */
  DISC_COLUMN_ADD = 2,      /* x + column[j] */
  DISC_COLUMN_SUB = 3,      /* x - column[j] */
  DISC_CONSTANT_MUL = 4,    /* x * constant */
  DISC_CONSTANT_ADD = 5,    /* x + constant */
  DISC_CONSTANT_MAX = 6,    /* disc_max(x, constant), or (constant, x) */
  DISC_CONSTANT_MIN = 7,    /* disc_min(x, constant), or (constant, x) */
  DISC_MATRIX_ADD = 8,      /* x + operand[e] */
  DISC_MATRIX_MUL = 9,      /* x * operand[e] */
};
#define DISC_COLUMN_STEPS 6
/* The most DISC_MATRIX_* steps a chain may have: a GEMM block copies their rows for a
 * tile narrower than its vectors. */
#define DISC_MATRIX_STEPS 2
typedef struct disc_column_step {
  int32_t op;          /* DISC_COLUMN_*, DISC_CONSTANT_* or DISC_MATRIX_* */
  int32_t value_first; /* maximum and minimum: x is the first operand */
  const float* operand; /* DISC_COLUMN_*: one float per column; DISC_MATRIX_*: as C */
  float constant;      /* DISC_CONSTANT_* */
} disc_column_step;
typedef struct disc_column_epilogue {
  const float* c;  /* the GEMM's C */
  float* out;      /* the result, laid out as C (may be c) */
  int64_t rows;    /* rows of C per product */
  int64_t cols;    /* columns of C (its row stride) */
  int32_t steps;   /* at most DISC_COLUMN_STEPS */
  disc_column_step step[DISC_COLUMN_STEPS];
} disc_column_epilogue;

/* ABI 12. One layer of sgemm_layers: C = A op(B), then the layer's epilogue on C. */
typedef struct disc_gemm_layer {
  int64_t n;             /* columns of C (the next layer's depth) */
  const float* b;        /* op(B): k x n row-major (row stride ldb), or n x k with transpose_b */
  int64_t ldb;
  int32_t transpose_b;
  float* c;              /* C in memory (row stride n), or NULL: each task's rows of C in its
                            own scratch only, C never whole */
  /* The epilogue, at most one of the two: `rows` on rows [i0, i1) of C where they lie
   * (c_rows, row stride ldc; q is 0), all n columns; or `columns`, steps the host runs
   * on C's registers as it stores them (their c, and out where it equals c, stand for
   * C where its rows lie: in memory or in scratch). */
  disc_gemm_scratch_fn rows;
  void* closure;
  const disc_column_epilogue* columns;
  /* Where the next layer reads its A, the epilogue's result: NULL: C's rows where they
   * lie (the epilogue wrote in C's place, or there is none); else memory of row
   * stride n. */
  const float* result;
} disc_gemm_layer;

typedef struct disc_ral disc_ral;

struct disc_ral {
  int32_t abi_version; /* DISC_RAL_ABI_VERSION of the host */
  int32_t num_inputs;
  int32_t num_outputs;

  /* Input i: rank, dims (rank entries, valid for the call), TF dtype, data. */
  int32_t (*input_rank)(disc_ral* ral, int32_t i);
  const int64_t* (*input_dims)(disc_ral* ral, int32_t i);
  int32_t (*input_dtype)(disc_ral* ral, int32_t i);
  const void* (*input_data)(disc_ral* ral, int32_t i);

  /* Allocates output i with the given dims through the host's allocator (TF:
   * allocate_output). Returns NULL with an error set on failure; may return
   * NULL without error for a zero-element output. */
  void* (*alloc_output)(disc_ral* ral, int32_t i, int32_t rank,
                        const int64_t* dims);

  /* Scratch memory, 64-byte aligned, released by free_temp or at the end of
   * the call. Returns NULL with an error set on failure (bytes may be 0). */
  void* (*alloc_temp)(disc_ral* ral, int64_t bytes);
  void (*free_temp)(disc_ral* ral, void* ptr);

  /* Runs fn over [0, total) split into ranges on the host's intra-op thread
   * pool; cost_per_unit is an estimate of cycles per index. Blocks until all
   * ranges are done. */
  void (*parallel_for)(disc_ral* ral, int64_t total, double cost_per_unit,
                       disc_range_fn fn, void* closure);

  /* Records an error (a DISC_* code and a message); the host turns it into a
   * TF Status once disc_entry returns non-zero. */
  void (*set_error)(disc_ral* ral, int32_t code, const char* message);

  /* ---- ABI 2 ---- */

  /* Batched single-precision GEMM, row-major, beta = 0: for b in [0, batch),
   *   C_b[m x n] = op(A_b) * op(B_b)
   * with A_b = a + b * stride_a, op(A_b) = A_b ([m x k], row stride lda) or,
   * if transpose_a, A_b^T (A_b is [k x m], row stride lda); likewise B_b
   * ([k x n] or, transposed, [n x k], row stride ldb) and C_b = c + b * stride_c
   * (row stride ldc). k == 0 writes zeros. Runs on the host's intra-op pool. */
  void (*sgemm_batched)(disc_ral* ral, int64_t batch, int64_t m, int64_t n,
                        int64_t k, const float* a, int64_t lda,
                        int64_t stride_a, int transpose_a, const float* b,
                        int64_t ldb, int64_t stride_b, int transpose_b,
                        float* c, int64_t ldc, int64_t stride_c);

  /* ABI 3. sgemm_batched with a two-level batch, so that operands read through a
   * transpose need no copy: product q = qo * batch_inner + qi (qo < batch_outer)
   * reads A at a + qo * stride_a_outer + qi * stride_a_inner, and likewise B and
   * C. Artifacts of ABI 2 (which never call it) still run. */
  void (*sgemm_strided)(disc_ral* ral, int64_t batch_outer, int64_t batch_inner,
                        int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                        int64_t stride_a_outer, int64_t stride_a_inner, int transpose_a,
                        const float* b, int64_t ldb, int64_t stride_b_outer,
                        int64_t stride_b_inner, int transpose_b, float* c, int64_t ldc,
                        int64_t stride_c_outer, int64_t stride_c_inner);

  /* ABI 4. sgemm_strided, then `epilogue` on every block of C the host computes
   * as one task, on the thread that computed it, right after (the consumer of C
   * fused into the GEMM reads the block while it is in cache). Blocks of
   * different tasks are disjoint; together they cover C once. With full_rows
   * set every block spans all n columns (a row-wise consumer). With accumulate,
   * C += op(A) op(B) (a convolution's taps); epilogue may be NULL. */
  void (*sgemm_epilogue)(disc_ral* ral, int64_t batch_outer, int64_t batch_inner,
                         int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                         int64_t stride_a_outer, int64_t stride_a_inner, int transpose_a,
                         const float* b, int64_t ldb, int64_t stride_b_outer,
                         int64_t stride_b_inner, int transpose_b, float* c, int64_t ldc,
                         int64_t stride_c_outer, int64_t stride_c_inner,
                         disc_gemm_epilogue_fn epilogue, void* closure, int32_t full_rows,
                         int32_t accumulate);

  /* ABI 5. One GEMM on the calling thread, no pool: C[m x n] (+)= op(A) * op(B),
   * operands as in sgemm_batched (one product). For a GEMM that runs inside another's
   * epilogue on the rows that block just finished (attention's P * V after softmax). */
  void (*sgemm_rows)(disc_ral* ral, int64_t m, int64_t n, int64_t k, const float* a,
                     int64_t lda, int transpose_a, const float* b, int64_t ldb,
                     int transpose_b, float* c, int64_t ldc, int32_t accumulate);

  /* ABI 5. `count` GEMMs reading one A (the Q, K and V projections of one input):
   *   C_p[m x n_p] = A[m x k] * op(B_p)   for p in [0, count),
   * B_p as in sgemm_batched ([k x n_p], or [n_p x k] with transpose_b[p], row stride
   * ldb[p]), C_p with row stride ldc[p]. One launch: the host cuts rows into blocks,
   * and one task computes its rows of every C_p (its rows of A stay in cache), then
   * runs `epilogue` (may be NULL) on them: product 0, rows [i0, i1), columns
   * [0, n_{count-1}) -- the consumer of the last product, which may read the
   * others' same rows. */
  void (*sgemm_shared_a)(disc_ral* ral, int32_t count, int64_t m, int64_t k,
                         const float* a, int64_t lda, const float* const* b,
                         const int64_t* ldb, const int32_t* transpose_b, const int64_t* n,
                         float* const* c, const int64_t* ldc,
                         disc_gemm_epilogue_fn epilogue, void* closure);

  /* ABI 6. A stride-1, undilated Conv1D whose kernel width kw is a multiple of 3,
   * by Winograd's F(2, 3) or F(4, 3) over groups of three taps (the host picks: 2/3
   * or 1/2 of the direct conv's multiply-adds): x [batch, width, ci], filter w [kw, ci, co], c [batch, ow, co];
   * output column o reads input columns o - pad .. o - pad + kw - 1 (zeros outside
   * x). Then `epilogue` (may be NULL) on every block of C as sgemm_epilogue runs it
   * (q: the image; whole rows with full_rows). Returns 0 without touching C when the
   * host declines (the filter is not a constant input whose transform it keeps, the
   * CPU lacks its GEMM blocks, or the conv is too small to pay): the caller then runs
   * the conv itself; otherwise 1, errors set through set_error. */
  int32_t (*conv1d_winograd)(disc_ral* ral, int64_t batch, int64_t width, int64_t ci,
                             int64_t co, int64_t kw, int64_t pad, int64_t ow,
                             const float* x, const float* w, float* c,
                             disc_gemm_epilogue_fn epilogue, void* closure,
                             int32_t full_rows);

  /* ABI 7. sgemm_epilogue with whole rows for a C that nothing reads but what runs on
   * each block (attention's softmax and the P.V GEMM chained on it; a residual and
   * norm after a projection): each task computes its rows [i0, i1) of product q, all n
   * columns, into scratch of its own thread (row stride n) and calls fn on them there,
   * on the same thread, so that C need never exist whole: a [batch, heads, S, S]
   * matrix of scores is at most a few rows per thread. A product of one batch may keep
   * C whole for the launch instead (few rows: the threads share its columns first;
   * blocks cut short while B exceeds half of L2): fn then gets rows of that C, after
   * all their columns are computed, possibly on another thread. fn's contract is the
   * same: rows [i0, i1), all columns, at c with row stride ldc. */
  void (*sgemm_scratch_c)(disc_ral* ral, int64_t batch_outer, int64_t batch_inner,
                          int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                          int64_t stride_a_outer, int64_t stride_a_inner, int transpose_a,
                          const float* b, int64_t ldb, int64_t stride_b_outer,
                          int64_t stride_b_inner, int transpose_b, disc_gemm_scratch_fn fn,
                          void* closure);

  /* ABI 8. C (m x n, row stride ldc) = A B, B k x n row-major (ldb), with A never in
   * memory whole: each task has rows(rows_closure, i0, i1, dst) write its rows of A
   * (a convolution's windows) into scratch of its own thread and multiplies them
   * there, then runs `epilogue` (may be NULL) on its block as sgemm_epilogue does (one
   * product: q = 0; whole rows with full_rows). */
  void (*sgemm_gathered_a)(disc_ral* ral, int64_t m, int64_t n, int64_t k,
                           disc_gemm_gather_fn rows, void* rows_closure, const float* b,
                           int64_t ldb, float* c, int64_t ldc, disc_gemm_epilogue_fn epilogue,
                           void* closure, int32_t full_rows);

  /* ABI 9. sgemm_scratch_c computing, for each block of rows, only the first
   * cols(closure, q, i0, i1) columns of C in the block's scratch; the rest of the
   * block's row is left as it was (fn must not depend on it). Where the first rows
   * need fewer columns than n (a causal mask), blocks are cut shorter so that each
   * computes little beyond its own triangle. */
  void (*sgemm_scratch_c_cols)(disc_ral* ral, int64_t batch_outer, int64_t batch_inner,
                               int64_t m, int64_t n, int64_t k, const float* a, int64_t lda,
                               int64_t stride_a_outer, int64_t stride_a_inner,
                               int transpose_a, const float* b, int64_t ldb,
                               int64_t stride_b_outer, int64_t stride_b_inner,
                               int transpose_b, disc_gemm_scratch_fn fn, void* closure,
                               disc_gemm_cols_fn cols);

  /* ABI 10. Results kept across calls for a kernel that reads cluster inputs only
   * (`inputs`: n_inputs input numbers; `site`: the kernel in this artifact; `key`:
   * n_key values that, with those inputs, fix its results, such as its dims). When
   * every one of them is a constant input of this call (a variable's or a constant's
   * value), returns 1 with outs[i] holding output i (bytes[i]) as an earlier call
   * computed it from the same input buffers and key, valid until this call ends; or 0
   * with outs[i] fresh memory for the caller to compute them into, then call
   * fold_done(site). Otherwise (a non-constant input, folding off, no memory) -1: the
   * caller computes them into temporaries, as without folding. A host may leave both
   * NULL: every kernel then runs on every call. */
  int32_t (*fold_begin)(disc_ral* ral, int32_t site, const int32_t* inputs,
                        int32_t n_inputs, const int64_t* key, int32_t n_key,
                        const int64_t* bytes, int32_t n_outputs, void** outs);
  void (*fold_done)(disc_ral* ral, int32_t site);

  /* ABI 11. The epilogue function for a disc_column_epilogue closure: passed as the
   * epilogue of sgemm_epilogue or sgemm_gathered_a (without accumulate), the host may
   * run the steps on each tile of C as its GEMM block stores it, so that C is never
   * read back; called as any epilogue, it runs them over the block given. A host may
   * leave it NULL: the caller then passes its own epilogue. */
  disc_gemm_epilogue_fn column_epilogue;

  /* ABI 12. GEMMs each reading the last one's result as its A (an MLP's layers, a
   * transformer's feed-forward block): for p in [0, count), C_p = A_p op(B_p), then
   * layer p's epilogue on C_p; A_0 = a (m x k, row stride lda), A_p (m x n_{p-1}) is
   * layer p-1's result. The host cuts the rows into blocks and runs every layer on a
   * block, one after the other on one thread, before that thread takes another block:
   * no layer's result leaves cache between layers, there is one launch, and a C with
   * c NULL is never whole. (With few rows for the pool it may run the layers one
   * launch each, the epilogue contracts unchanged.) */
  void (*sgemm_layers)(disc_ral* ral, int64_t m, int64_t k, const float* a, int64_t lda,
                       int32_t count, const disc_gemm_layer* layers);
};

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* DISC_RAL_H_ */
