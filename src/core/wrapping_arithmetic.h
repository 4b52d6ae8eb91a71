// Integer arithmetic as ONNX (like numpy and onnxruntime) defines it: two's
// complement wrap-around, never C++'s undefined signed overflow, and a
// division that never traps. One definition for the kernels and for the
// compiler's constant folding, so that a folded shape computation gives what
// the kernel would have given at run time.
#pragma once

#include <type_traits>

namespace kiln {

template <typename T>
T wrapAdd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
}

template <typename T>
T wrapSub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
}

template <typename T>
T wrapMul(T a, T b) {
  // Types narrower than int would be promoted to (signed) int, whose
  // product can overflow: multiply them as unsigned int.
  using U = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
  return static_cast<T>(static_cast<U>(a) * static_cast<U>(b));
}

// Truncating, like C++ and onnxruntime. ONNX leaves x / 0 undefined; the
// hardware traps on it and on INT_MIN / -1, which must not kill the process:
// they give 0 and INT_MIN (wrapped).
template <typename T>
T wrapDiv(T a, T b) {
  if (b == 0) return 0;
  if constexpr (std::is_signed_v<T>) {
    if (b == -1) return wrapSub(T(0), a);
  }
  return static_cast<T>(a / b);
}

}  // namespace kiln
