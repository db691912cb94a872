#include "reader/permutation.h"

namespace fastload {

Permutation::Permutation(uint64_t seed, uint64_t epoch, uint64_t n) : n_(n) {
  unsigned bits = 0;
  for (uint64_t v = n > 0 ? n - 1 : 0; v != 0; v >>= 1) ++bits;
  half_bits_ = bits < 2 ? 1 : (bits + 1) / 2;
  mask_ = (uint64_t{1} << half_bits_) - 1;
  const uint64_t base = mix64(mix64(seed) ^ epoch);
  for (int i = 0; i < kRounds; ++i) keys_[i] = mix64(base + static_cast<uint64_t>(i));
}

uint64_t Permutation::encrypt(uint64_t x) const noexcept {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & mask_;
  for (int i = 0; i < kRounds; ++i) {
    const uint64_t next = left ^ (mix64(right ^ keys_[i]) & mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

uint64_t Permutation::operator()(uint64_t pos) const noexcept {
  uint64_t x = encrypt(pos);
  while (x >= n_) x = encrypt(x);
  return x;
}

}  // namespace fastload
