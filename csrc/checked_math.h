// Checked arithmetic for sizes, counts and offsets read from untrusted input
// (shards, manifests, record headers). Every such computation in the core goes
// through these helpers so that a wrap-around is an error, never a small
// buffer and a write past its end.
//
// checked_add / checked_mul return false on overflow (the output is then
// unspecified); add_or_throw / mul_or_throw throw DecodeError naming `what`.
// All functions are pure and thread-safe. GCC and Clang use their overflow
// builtins; other compilers (MSVC) the portable versions below, which
// core_tests checks against the builtins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "errors.h"

namespace fastload {

template <typename T>
[[nodiscard]] constexpr bool portable_checked_add(T a, T b, T* out) noexcept {
  *out = static_cast<T>(a + b);  // unsigned: wraps modulo 2^bits
  return *out >= a;
}

template <typename T>
[[nodiscard]] constexpr bool portable_checked_mul(T a, T b, T* out) noexcept {
  if (a != 0 && b > std::numeric_limits<T>::max() / a) return false;
  *out = static_cast<T>(a * b);
  return true;
}

template <typename T>
[[nodiscard]] constexpr bool checked_add(T a, T b, T* out) noexcept {
  static_assert(std::is_unsigned_v<T>, "checked_add is for unsigned sizes");
#if defined(__GNUC__) || defined(__clang__)
  return !__builtin_add_overflow(a, b, out);
#else
  return portable_checked_add(a, b, out);
#endif
}

template <typename T>
[[nodiscard]] constexpr bool checked_mul(T a, T b, T* out) noexcept {
  static_assert(std::is_unsigned_v<T>, "checked_mul is for unsigned sizes");
#if defined(__GNUC__) || defined(__clang__)
  return !__builtin_mul_overflow(a, b, out);
#else
  return portable_checked_mul(a, b, out);
#endif
}

// a + b, or DecodeError("<what>: size overflow").
template <typename T>
T add_or_throw(T a, T b, const char* what) {
  T out{};
  if (!checked_add(a, b, &out)) throw DecodeError(std::string(what) + ": size overflow");
  return out;
}

// a * b, or DecodeError("<what>: size overflow").
template <typename T>
T mul_or_throw(T a, T b, const char* what) {
  T out{};
  if (!checked_mul(a, b, &out)) throw DecodeError(std::string(what) + ": size overflow");
  return out;
}

// True when [offset, offset + length) lies inside [0, size), without overflow.
[[nodiscard]] constexpr bool range_inside(uint64_t offset, uint64_t length, uint64_t size) noexcept {
  return offset <= size && length <= size - offset;
}

}  // namespace fastload

namespace fastload {

// a * b, or Error("<what>: size overflow"): for sizes that come from a schema
// or arguments rather than from a record (Error is usually FastloadError).
template <typename Error, typename T>
T mul_or_raise(T a, T b, const std::string& what) {
  T out{};
  if (!checked_mul(a, b, &out)) throw Error(what + ": size overflow");
  return out;
}

// a + b, or Error("<what>: size overflow").
template <typename Error, typename T>
T add_or_raise(T a, T b, const std::string& what) {
  T out{};
  if (!checked_add(a, b, &out)) throw Error(what + ": size overflow");
  return out;
}

// v rounded up to a multiple of `align` (a power of two), or Error on overflow.
template <typename Error>
size_t align_up_or_raise(size_t v, size_t align, const std::string& what) {
  return add_or_raise<Error>(v, align - 1, what) & ~(align - 1);
}

}  // namespace fastload
