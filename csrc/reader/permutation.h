// Permutation: the epoch order of docs/ORDER.md (version 1), a bijection on
// [0, n) evaluated at any position in O(1) memory: a 6-round balanced Feistel
// network over the smallest even bit width covering n, with cycle walking.
// python/fastload/sampling/_order.py implements the same function; both reproduce the
// vectors in tests/data/order_vectors.json.
//
// Thread safety: immutable after construction.
#pragma once

#include <cstdint>

namespace fastload {

// SplitMix64's finaliser: the round function and key schedule. Inline: it runs
// six times per position, and a call per round was most of an epoch order's cost.
inline uint64_t mix64(uint64_t z) noexcept {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

class Permutation {
 public:
  static constexpr int kRounds = 6;
  Permutation(uint64_t seed, uint64_t epoch, uint64_t n);
  // The sample index at position `pos` (pos < n).
  uint64_t operator()(uint64_t pos) const noexcept;
  uint64_t size() const noexcept { return n_; }

 private:
  uint64_t encrypt(uint64_t x) const noexcept;
  uint64_t n_;
  unsigned half_bits_ = 0;
  uint64_t mask_ = 0;
  uint64_t keys_[kRounds] = {};
};

}  // namespace fastload
