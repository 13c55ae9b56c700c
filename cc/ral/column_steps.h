// column_steps.h -- one element of a column epilogue (disc_ral.h, ABI 11), as the
// generated kernels compute it: IEEE multiply, add and subtract (never contracted
// into an FMA), and disc_max / disc_min (a NaN x kept; else x > c, x < c, the
// constant on ties, which decides a signed zero; with the constant first, c > x ? c : x).
//
// Functions of internal linkage: each translation unit, built for its own ISA
// (gemm_kernel_<isa>.cc, the RAL at the baseline), has its own copy.
#ifndef DISC_TF_CC_RAL_COLUMN_STEPS_H_
#define DISC_TF_CC_RAL_COLUMN_STEPS_H_

#include <stdint.h>

#include "cc/ral/disc_ral.h"

// Whether step op reads one float per column of C, or a tensor laid out as C.
static inline bool DiscIsColumnStep(int32_t op) {
  return op == DISC_COLUMN_MUL || op == DISC_COLUMN_ADD || op == DISC_COLUMN_SUB;
}
static inline bool DiscIsMatrixStep(int32_t op) {
  return op == DISC_MATRIX_ADD || op == DISC_MATRIX_MUL;
}

// x, C's element e (its column j), after step s.
static inline float DiscColumnStep(const disc_column_step& s, float x, int64_t j, int64_t e) {
  switch (s.op) {
    case DISC_COLUMN_MUL: return x * s.operand[j];
    case DISC_COLUMN_ADD: return x + s.operand[j];
    case DISC_COLUMN_SUB: return x - s.operand[j];
    case DISC_MATRIX_ADD: return x + s.operand[e];
    case DISC_MATRIX_MUL: return x * s.operand[e];
    case DISC_CONSTANT_MUL: return x * s.constant;
    case DISC_CONSTANT_ADD: return x + s.constant;
    case DISC_CONSTANT_MAX:
      return s.value_first ? ((x > s.constant || x != x) ? x : s.constant)
                           : (s.constant > x ? s.constant : x);
    case DISC_CONSTANT_MIN:
      return s.value_first ? ((x < s.constant || x != x) ? x : s.constant)
                           : (s.constant < x ? s.constant : x);
    default: return x;
  }
}

// Every step of `ep` on x, element e of C (in its column j).
static inline float DiscColumnSteps(const disc_column_epilogue& ep, float x, int64_t j,
                                    int64_t e) {
  for (int s = 0; s < ep.steps; ++s) x = DiscColumnStep(ep.step[s], x, j, e);
  return x;
}

#endif  // DISC_TF_CC_RAL_COLUMN_STEPS_H_
