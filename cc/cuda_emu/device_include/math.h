// math.h of the CUDA emulator's device units (first on their include path): the
// math CUDA device code sees, without the C++ library's <cmath>, which took most of
// a device unit's compile. libm's functions, declared as glibc declares them (the
// compiler knows them by name, as it knows the __builtin_* that <cmath>'s float
// overloads call, so the code is the same); float overloads of the double names,
// as CUDA's math headers give device code, and mixed arguments of the two-argument
// functions (float and int, float and double) computed in double, as <cmath>
// promotes them; the classification functions for
// float and double over the compiler's type-generic builtins, as <cmath>'s.
#ifndef DISC_EMU_DEVICE_MATH_H_
#define DISC_EMU_DEVICE_MATH_H_

#define DISC_EMU_MATH_UNARY(name)             \
  extern "C" double name(double) noexcept;    \
  extern "C" float name##f(float) noexcept;   \
  inline float name(float x) { return name##f(x); }
#define DISC_EMU_MATH_BINARY(name)                                        \
  extern "C" double name(double, double) noexcept;                        \
  extern "C" float name##f(float, float) noexcept;                        \
  inline float name(float x, float y) { return name##f(x, y); }           \
  template <typename A, typename B>                                       \
  inline double name(A x, B y) {                                          \
    return name(static_cast<double>(x), static_cast<double>(y));          \
  }

DISC_EMU_MATH_UNARY(exp)
DISC_EMU_MATH_UNARY(exp2)
DISC_EMU_MATH_UNARY(expm1)
DISC_EMU_MATH_UNARY(log)
DISC_EMU_MATH_UNARY(log2)
DISC_EMU_MATH_UNARY(log10)
DISC_EMU_MATH_UNARY(log1p)
DISC_EMU_MATH_UNARY(sqrt)
DISC_EMU_MATH_UNARY(cbrt)
DISC_EMU_MATH_UNARY(sin)
DISC_EMU_MATH_UNARY(cos)
DISC_EMU_MATH_UNARY(tan)
DISC_EMU_MATH_UNARY(asin)
DISC_EMU_MATH_UNARY(acos)
DISC_EMU_MATH_UNARY(atan)
DISC_EMU_MATH_UNARY(sinh)
DISC_EMU_MATH_UNARY(cosh)
DISC_EMU_MATH_UNARY(tanh)
DISC_EMU_MATH_UNARY(asinh)
DISC_EMU_MATH_UNARY(acosh)
DISC_EMU_MATH_UNARY(atanh)
DISC_EMU_MATH_UNARY(erf)
DISC_EMU_MATH_UNARY(erfc)
DISC_EMU_MATH_UNARY(lgamma)
DISC_EMU_MATH_UNARY(tgamma)
DISC_EMU_MATH_UNARY(floor)
DISC_EMU_MATH_UNARY(ceil)
DISC_EMU_MATH_UNARY(trunc)
DISC_EMU_MATH_UNARY(round)
DISC_EMU_MATH_UNARY(rint)
DISC_EMU_MATH_UNARY(nearbyint)
DISC_EMU_MATH_UNARY(fabs)
DISC_EMU_MATH_BINARY(pow)
DISC_EMU_MATH_BINARY(fmod)
DISC_EMU_MATH_BINARY(remainder)
DISC_EMU_MATH_BINARY(atan2)
DISC_EMU_MATH_BINARY(hypot)
DISC_EMU_MATH_BINARY(fmin)
DISC_EMU_MATH_BINARY(fmax)
DISC_EMU_MATH_BINARY(copysign)

#undef DISC_EMU_MATH_UNARY
#undef DISC_EMU_MATH_BINARY

#define INFINITY (__builtin_inff())
#define NAN (__builtin_nanf(""))
#define HUGE_VALF (__builtin_huge_valf())
#define HUGE_VAL (__builtin_huge_val())

#define DISC_EMU_CLASSIFY(name)                                        \
  inline bool name(float x) { return __builtin_##name(x); }            \
  inline bool name(double x) { return __builtin_##name(x); }
DISC_EMU_CLASSIFY(isnan)
DISC_EMU_CLASSIFY(isinf)
DISC_EMU_CLASSIFY(isfinite)
DISC_EMU_CLASSIFY(signbit)
#undef DISC_EMU_CLASSIFY

#endif  // DISC_EMU_DEVICE_MATH_H_
