// aligned_buffer.h -- a growable 64-byte aligned float buffer, for the scratch a
// thread keeps across calls (the GEMM block's packing buffer, a Winograd tile's).
#ifndef DISC_TF_CC_RAL_ALIGNED_BUFFER_H_
#define DISC_TF_CC_RAL_ALIGNED_BUFFER_H_

#include <stdint.h>
#include <stdlib.h>

namespace disc_tf {

struct AlignedBuffer {
  float* data = nullptr;
  int64_t size = 0;  // floats
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { free(data); }
  // At least `floats` floats (contents not kept when it grows), or null if memory
  // ran out.
  float* Reserve(int64_t floats) {
    if (size < floats) {
      free(data);
      size = (floats + 15) / 16 * 16;
      data = static_cast<float*>(aligned_alloc(64, size * sizeof(float)));
      if (data == nullptr) size = 0;
    }
    return data;
  }
};

}  // namespace disc_tf

#endif  // DISC_TF_CC_RAL_ALIGNED_BUFFER_H_
