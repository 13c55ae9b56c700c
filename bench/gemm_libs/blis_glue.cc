// blis_glue.cc -- the BLIS calls of gemm_libs.cc, in a translation unit of
// their own: blis.h declares a CBLAS of its own that clashes with MKL's.
#include <blis.h>

extern "C" {

void glue_blis_init(int threads) {
  bli_init();  // before any arch query: BLIS_ARCH_TYPE is honoured only after it
  bli_thread_set_num_threads(threads);
}

const char* glue_blis_version(void) { return bli_info_get_version_str(); }
const char* glue_blis_arch(void) { return bli_arch_string(bli_arch_query_id()); }
int glue_blis_threads(void) { return static_cast<int>(bli_thread_get_num_threads()); }

// Row-major C[m x n] = A[m x k] B[k x n].
void glue_blis_sgemm(long m, long n, long k, const float* a, const float* b, float* c) {
  float one = 1.0f, zero = 0.0f;
  bli_sgemm(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, m, n, k, &one, const_cast<float*>(a), k, 1,
            const_cast<float*>(b), n, 1, &zero, c, n, 1);
}

}  // extern "C"
