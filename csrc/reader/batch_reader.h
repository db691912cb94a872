// BatchReader: a pool of worker threads that decode batches of records from a
// ShardSet straight into pooled batch buffers.
//
// The consumer (one thread: the Python iterator) submits batches, each a list
// of global sample indices plus a slot, and receives them back strictly in
// submission order with wait_next(). Workers split every batch into chunks
// (about 4 per thread, none under 64 KiB of output) and claim them with an
// atomic counter, so all threads work on the oldest batch first without
// contending for a lock. Each worker owns a RecordDecoder; records are read
// straight from the shards' validated mappings (shard_reader.h).
//
// A worker's error (corrupt record, missing key) is stored with its batch as
// an exception_ptr and rethrown by wait_next() at that batch; batches before
// it are delivered intact. When several samples of a batch fail, the one at
// the lowest position in the batch wins, so the error is deterministic.
//
// Batch layout in a slot: field f occupies [field_offset(f), + capacity *
// sample_bytes(f)), sample i of field f at field_offset(f) + i *
// sample_bytes(f). Offsets are 64-byte aligned. A split slot (add_split_slot)
// has one buffer per field instead, sample i of field f at buffer f + i *
// sample_bytes(f). sample_bytes(f) is the decoded size, or the transformed
// size when a TransformPipeline changes the field: its steps run on each
// sample between decoding (into per-thread scratch) and the slot, with the
// sample's parameters given to submit().
// Every size here is computed with checked arithmetic; a slot that would wrap
// around or exceed the machine's physical memory is a FastloadError from the
// constructor, before anything is allocated.
//
// Thread safety: submit(), wait_next(), close() and the destructor belong to
// the consumer thread; stats() may be called from any thread. close() is
// idempotent, discards batches not yet delivered and joins every worker; the
// destructor calls it, so no thread outlives its reader.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "format/record_decoder.h"
#include "reader/permutation.h"
#include "reader/rank_plan.h"
#include "reader/shard_reader.h"
#include "reader/slot_pool.h"
#include "transforms/pipeline.h"

namespace fastload {

struct CompletedBatch {
  std::shared_ptr<Slot> slot;
  size_t count = 0;
};

struct ReaderOptions {
  size_t batch_capacity = 1;
  size_t num_threads = 1;
  // How many workers decode at once (0: num_threads). The others wait for a turn, taken when a worker
  // has no work left: threads beyond the cores that run them only take turns with the ones running
  // (the policy decides: fastload/loading/_specs.py running_threads). While workers wait for reads
  // from disk (a slow chunk whose thread had major page faults, where the system counts them per
  // thread), every worker runs, until a second passes with none: reads in flight, one per thread.
  size_t max_running = 0;
  bool verify_checksums = true;
  std::vector<bool> decode_field;  // per field; empty means every field
  // Optional: every sample's fields go through it (decoded into per-thread
  // scratch first); the slot then holds the transformed fields.
  std::shared_ptr<const TransformPipeline> transforms;
  uint64_t max_sample_bytes = kDefaultMaxSampleBytes;  // a larger schema is refused
  uint16_t record_version = kRecordVersion;            // the manifest's format_version
  uint64_t schema_fingerprint = 0;                     // v2: what every record must carry
  // v3: per shard of the ShardSet, the binding fingerprint its records carry
  // (schema, dataset id, shard index: docs/FORMAT.md); required for v3, one
  // per shard. Empty for v1 and v2: schema_fingerprint for every shard.
  std::vector<uint64_t> shard_fingerprints;
  // Optional: the pool of an earlier reader over the same fields (plain slots,
  // one buffer each, as SlotPool::add makes), reused when its slots are this
  // reader's size, so that a new pass neither allocates nor page-faults its
  // batch buffers again. A slot still viewed by the consumer returns to it
  // when released, as with one reader. Lend it to one reader at a time.
  std::shared_ptr<SlotPool> pool;
};

struct ReaderStats {
  uint64_t batches = 0;        // delivered to the consumer
  uint64_t samples = 0;        // decoded by workers
  uint64_t bytes_read = 0;     // record bytes taken from the shards
  uint64_t bytes_decoded = 0;  // bytes written into batch buffers
  uint64_t read_ns = 0;        // in record lookups, summed over workers
  uint64_t decode_ns = 0;      // in decompress/copy/verify, summed over workers
  uint64_t decompress_ns = 0;  // the part of decode_ns spent inside zstd
  uint64_t transform_ns = 0;   // in transform kernels, summed over workers
  uint64_t wait_ns = 0;        // the consumer blocked in wait_next
  uint64_t peak_running = 0;   // the most workers that held a turn at once (max_running(), or all of them
                               // while reads from disk are seen)
  uint64_t disk_chunks = 0;    // chunks whose worker waited for a read from disk (seen with max_running only)
};

class BatchReader {
 public:
  BatchReader(std::shared_ptr<const ShardSet> shards, std::vector<FieldSpec> fields, ReaderOptions options);
  ~BatchReader();
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;

  size_t slot_bytes() const noexcept { return slot_bytes_; }
  size_t field_offset(size_t f) const { return offsets_.at(f); }
  bool decodes_field(size_t f) const { return decode_.at(f); }
  size_t batch_capacity() const noexcept { return capacity_; }
  size_t num_threads() const noexcept { return workers_.size(); }
  size_t max_running() const noexcept { return max_running_; }
  const std::shared_ptr<SlotPool>& pool() const noexcept { return pool_; }
  // Bytes field f of one batch needs in a buffer of its own (capacity * decoded bytes).
  size_t field_bytes(size_t f) const { return capacity_ * sample_bytes(f); }
  // Bytes of one sample of field f in a slot (after transforms).
  size_t sample_bytes(size_t f) const { return static_cast<size_t>(sample_bytes_.at(f)); }

  // Adds a slot of one buffer per field: buffers[f] = (data, size), null for a
  // field not decoded. Throws FastloadError when a decoded field's buffer is
  // missing or smaller than field_bytes(f).
  void add_split_slot(const std::vector<std::pair<uint8_t*, size_t>>& buffers, std::shared_ptr<void> owner,
                      bool reusable);

  // Queues one batch and returns true. Over a lazy ShardSet it pins the
  // shards the batch reads until the batch is delivered (or dropped), and
  // returns false, queuing nothing, when one of them is not attached. Throws
  // FastloadError when closed, when there are more indices than the capacity,
  // when no slot is free (add one first), or when params does not hold the
  // pipeline's num_params() per sample (row-major).
  bool submit(std::vector<uint64_t> indices, std::vector<int64_t> params = {});

  // Plans batches ahead: the reader submits them itself, in order, keeping
  // at most window() batches submitted and not yet delivered, each as soon as
  // a slot is free (in wait_next(), and in a worker about to go idle). A consumer
  // that plans its epoch a stretch at a time then only calls wait_next() per
  // batch. `indices` holds the batches' sample indices one after another,
  // `sizes` each batch's count (1 to the capacity), `params` the pipeline's
  // num_params() per sample (row-major). Everything is checked before
  // anything is queued. Over a lazy ShardSet every shard must be attached
  // (a cache holding the whole dataset): each stays pinned, and so attached,
  // until every batch of this plan is delivered or dropped; a set with a
  // shard missing is refused (its batches are gated on downloads by the
  // caller, through submit()). Throws FastloadError then, when closed, or on
  // a bad index, size or parameter count.
  // With `order`, the values are positions of that epoch order (each below its
  // size, which is at most the shards' records) and each worker maps those of
  // its chunk to sample indices: the order's cost falls on the workers.
  void plan(const std::vector<uint64_t>& indices, const std::vector<size_t>& sizes,
            const std::vector<int64_t>& params = {}, std::shared_ptr<const Permutation> order = nullptr);
  // Plans batches first to stop - 1 of `plan` (RankPlan: positions worked out
  // batch by batch as the window reaches them, each mapped through `order`
  // when set, else sample indices), after any batches plan() queued. As
  // plan(), with the same checks, for readers without transform parameters.
  // Throws FastloadError when transforms draw parameters, on a range outside
  // the plan, batches larger than the capacity, a position outside the order
  // (or the shards), when closed, or while planned batches are still queued.
  void plan_positions(const RankPlan& plan, size_t first, size_t stop,
                      std::shared_ptr<const Permutation> order = nullptr);
  // Planned batches submitted and not yet delivered: at most `window` (at
  // least 1), and at most `first_window` until the first batch is delivered,
  // so that the first batch does not wait for the others' slots.
  void set_window(size_t window, size_t first_window);
  // Planned batches not yet submitted.
  size_t planned() const;
  // How many free slots the planned batches lack now to fill the window: add
  // that many before wait_next(), or the window stays short of them.
  size_t slots_wanted() const;
  // Submits planned batches as the window and the free slots allow (what
  // wait_next() does first), so that workers start on slots just added while
  // the caller does something else before waiting. Throws FastloadError when
  // closed.
  void submit_planned();
  // Whether wait_next() would return at once: the oldest submitted batch is
  // complete, or nothing is submitted (wait_next() then says why).
  bool next_ready() const;

  // The oldest submitted batch once complete; nullopt when `timeout` passes
  // first. When it is not complete yet (after the first batch), this waits
  // until the oldest three quarters of the window are, so that a consumer faster than
  // the workers blocks once per several batches rather than once per batch.
  // Submits planned batches first, as the window and the free slots allow.
  // Rethrows that batch's error. Throws FastloadError if nothing is pending
  // (nothing submitted, or planned batches and no free slot) or the reader is
  // closed. A timeout of 0 only takes a batch already complete: no wait.
  std::optional<CompletedBatch> wait_next(std::chrono::milliseconds timeout);

  size_t pending() const;
  // Batches decoded and waiting for the consumer (in order from the oldest).
  size_t ready() const;
  void close() noexcept;
  bool closed() const;
  ReaderStats stats() const;
  void reset_stats();

  // Test seam, not product API: from now on every worker sleeps `delay_us`
  // before each record read (counted as read time), so lifecycle tests can
  // catch a pass with batches in flight. Reached from Python only through
  // fastload._native._testing (tests/seams.py). Any thread.
  void set_read_delay_for_tests(uint32_t delay_us) noexcept { read_delay_us_.store(delay_us); }
  // Test seam, not product API: every slow chunk counts as one that waited for the disk (a real
  // wait needs pages out of the page cache, which a test cannot arrange under a mapping). Any thread.
  void set_disk_reads_for_tests(bool on) noexcept { disk_reads_for_tests_.store(on); }

 private:
  struct Job;
  void worker_main(size_t index);
  struct Scratch;
  void run_chunk(Job& job, size_t chunk, RecordDecoder& decoder, Scratch& scratch);
  std::shared_ptr<Job> make_job(std::vector<uint64_t> indices, std::vector<int64_t> params) const;
  // Throws unless count fits a slot, params matches it and every index is in range (below order's size, with one).
  void check_batch(const char* what, const uint64_t* indices, size_t count, size_t params,
                   const Permutation* order) const;
  void start_locked(std::shared_ptr<Job> job);  // into inflight_ and work_ (wakes nobody)
  void wake_locked();                           // idle workers, as many as there are chunks to take
  void submit_planned_locked();                 // planned_ into the window, as free slots allow
  void refill_locked();                         // the consumer's: submit_planned_locked, and wake if due
  size_t window_locked() const;
  size_t planned_locked() const;                // planned batches not yet submitted (queued and of cursor_)
  size_t ready_locked(size_t at_most) const;    // leading batches complete, counted up to at_most
  size_t wake_after_locked() const;             // how many leading batches a waiting consumer waits for

  std::shared_ptr<const ShardSet> shards_;
  std::vector<FieldSpec> fields_;
  std::vector<uint64_t> sample_bytes_;
  std::shared_ptr<const TransformPipeline> transforms_;
  size_t capacity_;
  std::vector<bool> decode_;
  std::vector<size_t> offsets_;
  std::atomic<uint32_t> read_delay_us_{0};  // set_read_delay_for_tests
  std::atomic<bool> disk_reads_for_tests_{false};  // set_disk_reads_for_tests
  size_t slot_bytes_ = 0;
  size_t chunk_size_ = 1;
  bool verify_;
  DecoderOptions decoder_options_;
  std::vector<uint64_t> fingerprints_;  // per shard: what its records' fingerprint field must hold
  std::shared_ptr<SlotPool> pool_;

  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  std::deque<std::shared_ptr<Job>> work_;      // jobs with chunks not yet claimed
  std::deque<std::shared_ptr<Job>> inflight_;  // every undelivered job, in order
  std::deque<std::shared_ptr<Job>> planned_;   // planned jobs not yet submitted (no slot yet), in order
  struct RankCursor;                           // plan_positions(): the batches left of a RankPlan
  std::unique_ptr<RankCursor> cursor_;         // after planned_; null when none was planned
  size_t window_ = 1;                          // set_window (guarded by mutex_)
  size_t first_window_ = 1;
  bool delivered_any_ = false;                 // a batch was delivered (guarded by mutex_)
  size_t consumer_wants_ = 0;                  // leading batches the waiting consumer waits for; 0: not waiting
  bool wake_workers_after_sleep_ = false;      // the consumer slept: idle workers get one wake for new work
  bool stop_ = false;
  // Idle workers wait on their own condition variable, and wake_locked() wakes the one that went idle
  // last: the threads that run stay few and hot (their caches, their core), however many there are.
  std::unique_ptr<std::condition_variable[]> worker_cv_;  // per worker
  std::vector<char> woken_;                               // per worker: woken with a turn (guarded by mutex_)
  std::vector<size_t> idle_;                              // idle workers, the last to go idle last (mutex_)
  size_t max_running_ = 1;  // workers that may hold a turn at once (ReaderOptions::max_running)
  size_t running_ = 0;      // workers holding a turn: from taking work (or a wake) to finding none (mutex_)
  size_t peak_running_ = 0;  // the most running_ was since reset_stats() (mutex_)
  void take_turn_locked();   // ++running_, and peak_running_ with it
  size_t turns_locked() const;  // max_running_, or every worker while reads from disk are seen
  // After a chunk that began at `start`: when it was slow and the worker's major faults grew past
  // `seen`, every worker may run for the next second (and idle ones are woken for queued work).
  void note_disk_reads(std::chrono::steady_clock::time_point start, uint64_t& seen);
  std::atomic<int64_t> disk_until_ns_{0};  // steady-clock ns until which every worker may run
  std::atomic<bool> stop_flag_{false};  // stop_, readable without the lock between chunks
  std::vector<std::thread> workers_;

  std::atomic<uint64_t> batches_{0}, samples_{0}, bytes_read_{0}, bytes_decoded_{0};
  std::atomic<uint64_t> read_ns_{0}, decode_ns_{0}, decompress_ns_{0}, wait_ns_{0}, transform_ns_{0};
  std::atomic<uint64_t> disk_chunks_{0};
};

}  // namespace fastload
