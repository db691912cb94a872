#include "reader/rank_plan.h"

#include <algorithm>
#include <limits>
#include <string>

#include "checked_math.h"
#include "errors.h"

namespace fastload {

RankPlan::RankPlan(uint64_t start, uint64_t remaining, uint64_t rank, uint64_t world_size, uint64_t samples,
                   uint64_t batch_size)
    : start_(start),
      remaining_(remaining),
      rank_(rank),
      world_size_(world_size),
      samples_(samples),
      batch_size_(batch_size) {
  const auto fail = [](const std::string& why) { throw FastloadError("RankPlan: " + why); };
  if (world_size == 0 || batch_size == 0) fail("world_size and batch_size must be at least 1");
  if (rank >= world_size) fail("rank " + std::to_string(rank) + " outside world_size " + std::to_string(world_size));
  if (samples > 0 && remaining == 0) fail(std::to_string(samples) + " samples from no remaining positions");
  uint64_t end = 0, last = 0;
  if (!checked_add(start, remaining, &end)) fail("start + remaining overflows 64 bits");
  // The largest offset rank + j * world_size any batch forms (j < samples) must not wrap.
  if (samples > 0 && (!checked_mul(samples - 1, world_size, &last) || !checked_add(last, rank, &last))) {
    fail(std::to_string(samples) + " samples over world_size " + std::to_string(world_size) + " overflow 64 bits");
  }
  const uint64_t batches = samples / batch_size + (samples % batch_size != 0 ? 1 : 0);
  if (batches > std::numeric_limits<size_t>::max()) fail("too many batches");
  batch_count_ = static_cast<size_t>(batches);
}

size_t RankPlan::batch_samples(size_t b) const noexcept {
  const uint64_t first = static_cast<uint64_t>(b) * batch_size_;  // b < batch_count: no overflow
  return static_cast<size_t>(std::min(batch_size_, samples_ - first));
}

std::vector<uint64_t> RankPlan::positions(size_t b) const {
  const uint64_t first = static_cast<uint64_t>(b) * batch_size_;
  const size_t count = batch_samples(b);
  std::vector<uint64_t> out(count);
  for (size_t i = 0; i < count; ++i) out[i] = start_ + (rank_ + (first + i) * world_size_) % remaining_;
  return out;
}

}  // namespace fastload
