#include "reader/warmer.h"

#include <algorithm>
#include <chrono>

#include "errors.h"
#include "platform/platform.h"

namespace fastload {

namespace {

constexpr size_t kStep = size_t{2} << 20;  // 2 MiB: a step is over in milliseconds, so stop() is prompt

}  // namespace

Warmer::Warmer(std::vector<Buffer> buffers, std::shared_ptr<const ShardSet> shards, uint64_t max_mapping_bytes)
    : buffers_(std::move(buffers)), shards_(std::move(shards)), max_mapping_bytes_(max_mapping_bytes) {
  if (shards_ && shards_->lazy()) throw FastloadError("Warmer: a lazy shard set cannot be warmed (its shards come and go)");
  thread_ = std::make_unique<std::thread>([this] { run(); });
}

Warmer::~Warmer() { stop(); }

void Warmer::stop() noexcept {
  request_stop();
  if (thread_ && thread_->joinable()) thread_->join();
}

void Warmer::abandon() noexcept { static_cast<void>(thread_.release()); }

Warmer::Stats Warmer::stats() const noexcept {
  Stats s;
  s.prefaulted_bytes = prefaulted_.load(std::memory_order_relaxed);
  s.claimed_bytes = claimed_.load();
  s.mapped_bytes = mapped_.load(std::memory_order_relaxed);
  s.seconds = static_cast<double>(nanoseconds_.load(std::memory_order_relaxed)) * 1e-9;
  s.done = done_.load(std::memory_order_acquire);
  s.supported = supported_.load(std::memory_order_relaxed);
  return s;
}

void Warmer::run() noexcept {
  name_this_thread("fastload-warm");
  const auto start = std::chrono::steady_clock::now();
  const auto account = [&] {
    nanoseconds_.store(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                 std::chrono::steady_clock::now() - start)
                                                 .count()),
                       std::memory_order_relaxed);
  };
  bool supported = true;
  uint64_t offset = 0;  // of the buffers laid end to end
  for (const Buffer& buffer : buffers_) {
    for (size_t done = 0; supported && done < buffer.size;) {
      const size_t step = std::min(kStep, buffer.size - done);
      // Claim the step, then look for a stop (both seq_cst, as request_stop() and the caller's read of
      // claimed_bytes after it): either this thread sees the stop and skips the step, or the caller sees the
      // claim, so nothing past claimed_bytes is touched once a caller has read it after request_stop().
      claimed_.store(offset + done + step);
      if (stopping()) break;
      supported = prefault_for_writing(buffer.data + done, step);
      if (supported) prefaulted_.fetch_add(step, std::memory_order_relaxed);
      done += step;
      account();
    }
    if (stopping()) break;
    offset += buffer.size;
  }
  uint64_t looked_at = 0;
  const size_t count = shards_ ? shards_->size() : 0;
  for (size_t i = 0; i < count && supported && !stopping() && looked_at < max_mapping_bytes_; ++i) {
    if (!shards_->attached(i)) continue;  // an eager set has every shard (shard() would throw otherwise)
    const FileMapping& mapping = shards_->shard(i).mapping();
    for (uint64_t done = 0; supported && done < mapping.size() && !stopping() && looked_at < max_mapping_bytes_;) {
      const auto step = static_cast<size_t>(std::min<uint64_t>(kStep, mapping.size() - done));
      size_t mapped = 0;
      supported = map_cached_pages(mapping.data() + done, step, &mapped);
      mapped_.fetch_add(mapped, std::memory_order_relaxed);
      done += step;
      looked_at += step;
      account();
    }
  }
  supported_.store(supported, std::memory_order_relaxed);
  account();
  done_.store(true, std::memory_order_release);
}

}  // namespace fastload
