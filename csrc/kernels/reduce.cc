#include "kernels/reduce.h"

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

namespace tilecomm::kernels {
namespace {

// ---- 16-bit floats, converted by hand so the engine needs no torch headers ----

inline float bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t floatToBf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // canonical quiet NaN
  bits += 0x7fffu + ((bits >> 16) & 1u);                    // round to nearest even
  return static_cast<uint16_t>(bits >> 16);
}

inline float halfToFloat(uint16_t h) {
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal half: value = man * 2^-24, exact in float
    float f = static_cast<float>(man) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

inline uint16_t floatToHalf(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t abs = bits & 0x7fffffffu;
  if (abs > 0x7f800000u) return 0x7e00;                  // NaN
  if (abs >= 0x477ff000u) return sign | 0x7c00;           // rounds to inf (>= 65520)
  if (abs < 0x38800000u) {                                // result is subnormal or zero
    // value / 2^-24, rounded to nearest even by the FPU's default mode.
    float a;
    std::memcpy(&a, &abs, 4);
    float scaled = a * 16777216.0f;  // exact scaling by 2^24
    float r = std::nearbyint(scaled);
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t mant_odd = (abs >> 13) & 1u;
  abs += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round to nearest even
  return sign | static_cast<uint16_t>(abs >> 13);
}

// ---- element-wise ops ----

template <typename T>
inline T minOf(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    if (a == b) return std::signbit(a) ? a : b;  // min(+0, -0) = -0 in either order
  }
  return b < a ? b : a;
}

template <typename T>
inline T maxOf(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<T>::quiet_NaN();
    if (a == b) return std::signbit(a) ? b : a;
  }
  return b > a ? b : a;
}

template <typename T, RedOp kOp>
inline T apply(T a, T b) {
  if constexpr (kOp == RedOp::kSum) {
    if constexpr (std::is_same_v<T, bool>) return a || b;
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(
        static_cast<std::make_unsigned_t<T>>(a) + static_cast<std::make_unsigned_t<T>>(b));  // wraps like torch
    else return a + b;
  } else if constexpr (kOp == RedOp::kProduct) {
    if constexpr (std::is_same_v<T, bool>) return a && b;
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(
        static_cast<std::make_unsigned_t<T>>(a) * static_cast<std::make_unsigned_t<T>>(b));
    else return a * b;
  } else if constexpr (kOp == RedOp::kMin) {
    return minOf(a, b);
  } else if constexpr (kOp == RedOp::kMax) {
    return maxOf(a, b);
  } else if constexpr (kOp == RedOp::kBand) {
    return static_cast<T>(a & b);
  } else if constexpr (kOp == RedOp::kBor) {
    return static_cast<T>(a | b);
  } else {
    return static_cast<T>(a ^ b);
  }
}

template <typename T, RedOp kOp>
void loop(void* dst, const void* src, size_t n) {
  T* __restrict d = static_cast<T*>(dst);
  const T* __restrict s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) d[i] = apply<T, kOp>(d[i], s[i]);
}

// 16-bit floats: widen, combine in float, round back once.
template <bool kBf16, RedOp kOp>
void loopHalf(void* dst, const void* src, size_t n) {
  uint16_t* __restrict d = static_cast<uint16_t*>(dst);
  const uint16_t* __restrict s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    float a = kBf16 ? bf16ToFloat(d[i]) : halfToFloat(d[i]);
    float b = kBf16 ? bf16ToFloat(s[i]) : halfToFloat(s[i]);
    float r = apply<float, kOp>(a, b);
    d[i] = kBf16 ? floatToBf16(r) : floatToHalf(r);
  }
}

template <typename T>
void loopComplex(void* dst, const void* src, size_t n, RedOp op) {
  using C = std::complex<T>;
  C* d = static_cast<C*>(dst);
  const C* s = static_cast<const C*>(src);
  if (op == RedOp::kSum) {
    for (size_t i = 0; i < n; ++i) d[i] += s[i];
  } else {
    // Written out so that a*b and b*a round identically.
    for (size_t i = 0; i < n; ++i) {
      T ar = d[i].real(), ai = d[i].imag(), br = s[i].real(), bi = s[i].imag();
      d[i] = C(ar * br - ai * bi, ar * bi + ai * br);
    }
  }
}

template <typename T>
void dispatchArith(void* d, const void* s, size_t n, RedOp op) {
  switch (op) {
    case RedOp::kSum: return loop<T, RedOp::kSum>(d, s, n);
    case RedOp::kProduct: return loop<T, RedOp::kProduct>(d, s, n);
    case RedOp::kMin: return loop<T, RedOp::kMin>(d, s, n);
    case RedOp::kMax: return loop<T, RedOp::kMax>(d, s, n);
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case RedOp::kBand: return loop<T, RedOp::kBand>(d, s, n);
      case RedOp::kBor: return loop<T, RedOp::kBor>(d, s, n);
      case RedOp::kBxor: return loop<T, RedOp::kBxor>(d, s, n);
      default: break;
    }
  }
}

template <bool kBf16>
void dispatchHalf(void* d, const void* s, size_t n, RedOp op) {
  switch (op) {
    case RedOp::kSum: return loopHalf<kBf16, RedOp::kSum>(d, s, n);
    case RedOp::kProduct: return loopHalf<kBf16, RedOp::kProduct>(d, s, n);
    case RedOp::kMin: return loopHalf<kBf16, RedOp::kMin>(d, s, n);
    case RedOp::kMax: return loopHalf<kBf16, RedOp::kMax>(d, s, n);
    default: break;
  }
}

bool isFloating(DType t) {
  return t == DType::kFloat16 || t == DType::kBFloat16 || t == DType::kFloat32 || t == DType::kFloat64;
}
bool isComplex(DType t) { return t == DType::kComplex64 || t == DType::kComplex128; }

}  // namespace

std::string checkReducible(DType dtype, RedOp op) {
  if (dtype == DType::kBytes) return "opaque bytes cannot be reduced";
  bool bitwise = op == RedOp::kBand || op == RedOp::kBor || op == RedOp::kBxor;
  if (bitwise && (isFloating(dtype) || isComplex(dtype)))
    return std::string(redOpName(op)) + " needs an integer or bool dtype, got " + dtypeName(dtype);
  if (isComplex(dtype) && op != RedOp::kSum && op != RedOp::kProduct)
    return std::string(redOpName(op)) + " is not defined on complex dtype " + dtypeName(dtype);
  if (op == RedOp::kNone) return "no reduction op given";
  return "";
}

void reduceInto(void* d, const void* s, size_t n, DType dtype, RedOp op) {
  switch (dtype) {
    case DType::kFloat16: return dispatchHalf<false>(d, s, n, op);
    case DType::kBFloat16: return dispatchHalf<true>(d, s, n, op);
    case DType::kFloat32: return dispatchArith<float>(d, s, n, op);
    case DType::kFloat64: return dispatchArith<double>(d, s, n, op);
    case DType::kInt8: return dispatchArith<int8_t>(d, s, n, op);
    case DType::kUInt8: return dispatchArith<uint8_t>(d, s, n, op);
    case DType::kInt16: return dispatchArith<int16_t>(d, s, n, op);
    case DType::kInt32: return dispatchArith<int32_t>(d, s, n, op);
    case DType::kInt64: return dispatchArith<int64_t>(d, s, n, op);
    case DType::kBool: return dispatchArith<bool>(d, s, n, op);
    case DType::kComplex64: return loopComplex<float>(d, s, n, op);
    case DType::kComplex128: return loopComplex<double>(d, s, n, op);
    default: return;
  }
}

}  // namespace tilecomm::kernels
