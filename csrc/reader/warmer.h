// Warmer: one background thread that, before a loader's first pass, makes the
// memory that pass touches first cheap to touch.
//
// A fresh process pays for every page the first time it touches it: the
// batch buffers (fresh memory: zeroed by the kernel, and on a virtual machine
// whose balloon reports free pages, first backed by the host) and the page
// tables of the shard mappings (one fault per 64 KiB of a file the page cache
// holds in small folios). Started when a loader is built, the Warmer takes
// those costs while the training script does other work (building the model,
// moving it to the GPU), in 2 MiB steps:
//   1. it faults in the pages of `buffers` (prefault_for_writing), then
//   2. maps the pages of the shards' files that the page cache already holds
//      (map_cached_pages; nothing is read from disk), shard by shard, until
//      `max_mapping_bytes` of the files were looked at.
// It stops when done, or at request_stop() or stop() (at most one step
// later): a pass that starts before it is done asks it to stop without
// waiting for the step in flight, and its workers fault in the rest as they
// would have. Which memory to warm, and whether to, is the caller's
// policy (fastload/loading/_warm_up.py).
//
// Thread safety: stop() and stats() may be called from any thread. The
// buffers must stay valid until stop() returns; the ShardSet (eager only) is
// kept alive by the Warmer. Errors: none; a system without the calls makes the
// Warmer finish at once (stats().supported false).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "reader/shard_reader.h"

namespace fastload {

class Warmer {
 public:
  struct Buffer {
    uint8_t* data = nullptr;
    size_t size = 0;
  };
  struct Stats {
    uint64_t prefaulted_bytes = 0;  // of the buffers
    uint64_t claimed_bytes = 0;     // of the buffers, up to the end of the step in flight: after
                                    // request_stop() the thread touches nothing past it
    uint64_t mapped_bytes = 0;      // of the shard files, cached pages mapped
    double seconds = 0;             // the thread's time so far
    bool done = false;              // finished (everything, or stopped)
    bool supported = true;          // false: the system has no calls for it
  };

  // Starts the thread. Throws FastloadError for a lazy ShardSet (its shards may
  // be detached while mapped), std::system_error when no thread can start.
  Warmer(std::vector<Buffer> buffers, std::shared_ptr<const ShardSet> shards, uint64_t max_mapping_bytes);
  ~Warmer();  // stop()
  Warmer(const Warmer&) = delete;
  Warmer& operator=(const Warmer&) = delete;

  // Asks the thread to stop and joins it; returns at once when it has ended.
  void stop() noexcept;
  // Asks the thread to stop and returns: it ends after the step in flight
  // (a 2 MiB fault of fresh memory can take milliseconds), joined by stop().
  void request_stop() noexcept { stop_.store(true); }
  Stats stats() const noexcept;
  // In a forked child, where the thread does not exist: lets go of it without
  // a join (the parent's thread object is leaked).
  void abandon() noexcept;

 private:
  void run() noexcept;
  bool stopping() const noexcept { return stop_.load(); }

  const std::vector<Buffer> buffers_;
  const std::shared_ptr<const ShardSet> shards_;
  const uint64_t max_mapping_bytes_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> done_{false};
  std::atomic<bool> supported_{true};
  std::atomic<uint64_t> prefaulted_{0};
  std::atomic<uint64_t> claimed_{0};  // seq_cst with stop_: see run()
  std::atomic<uint64_t> mapped_{0};
  std::atomic<uint64_t> nanoseconds_{0};
  std::unique_ptr<std::thread> thread_;  // last: started once everything above is set
};

}  // namespace fastload
