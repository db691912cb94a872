// RankPlan: the epoch positions one rank reads, batch by batch, as
// python/fastload/loading/_plan.py (EpochPlan) defines them. Batch b holds
// the positions start + (rank + j * world_size) % remaining for j from
// b * batch_size up to min((b + 1) * batch_size, samples). A pure function of
// its six numbers: the reader works out each batch as its window reaches it,
// so the consumer's thread computes no positions per batch.
//
// Thread safety: immutable after construction.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace fastload {

class RankPlan {
 public:
  // Throws FastloadError when world_size or batch_size is 0, rank is not
  // below world_size, samples > 0 with remaining 0, or a position or count
  // would not fit in 64 bits.
  RankPlan(uint64_t start, uint64_t remaining, uint64_t rank, uint64_t world_size, uint64_t samples,
           uint64_t batch_size);

  size_t batch_count() const noexcept { return batch_count_; }
  uint64_t batch_size() const noexcept { return batch_size_; }
  // One past the largest position any batch holds: every position lies in [start, end()).
  uint64_t end() const noexcept { return start_ + remaining_; }
  // The samples of batch b (b < batch_count()).
  size_t batch_samples(size_t b) const noexcept;
  // The positions of batch b (b < batch_count()), in order.
  std::vector<uint64_t> positions(size_t b) const;

 private:
  uint64_t start_, remaining_, rank_, world_size_, samples_, batch_size_;
  size_t batch_count_ = 0;
};

}  // namespace fastload
