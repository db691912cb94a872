#include "reader/batch_reader.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "checked_math.h"
#include "errors.h"
#include "platform/platform.h"

namespace fastload {
namespace {

constexpr size_t kAlign = 64;
// A chunk decodes at least this many output bytes (or one sample), so that
// claiming it costs little next to the work, whatever the thread count.
constexpr size_t kMinChunkBytes = 64 * 1024;
// A consumer that has to wait for its next batch sleeps until all but 1/kWorkShare of the window (and at
// least one batch) is ready: that share is what the workers go on with while it wakes up.
constexpr size_t kWorkShare = 4;

uint64_t elapsed_ns(std::chrono::steady_clock::time_point since) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - since).count());
}

}  // namespace

// Workers claim chunks of a job with an atomic counter, not under the shared
// lock; the lock is taken to pick the next job, to store an error, and by the
// worker that finishes a job's last chunk (to wake the consumer).
namespace {

// The shards a batch of a lazy ShardSet reads, pinned from submit() until the
// batch is delivered or dropped, so that no shard is detached under its reads.
class ShardPins {
 public:
  ShardPins() = default;
  ShardPins(std::shared_ptr<const ShardSet> set, std::vector<size_t> shards)
      : set_(std::move(set)), shards_(std::move(shards)) {}
  ShardPins(const ShardPins&) = delete;
  ShardPins& operator=(const ShardPins&) = delete;
  ShardPins& operator=(ShardPins&& other) noexcept {
    release();
    set_ = std::move(other.set_);
    shards_ = std::move(other.shards_);
    return *this;
  }
  ~ShardPins() { release(); }
  void release() noexcept {
    if (set_) set_->unpin(shards_);
    set_.reset();
  }

 private:
  std::shared_ptr<const ShardSet> set_;
  std::vector<size_t> shards_;
};

// The distinct shards `indices` read (each index already checked in range).
std::vector<size_t> shards_of(const ShardSet& shards, const std::vector<uint64_t>& indices) {
  std::vector<size_t> out;
  out.reserve(8);
  for (uint64_t index : indices) {
    const size_t shard = shards.locate(index).first;
    if (out.empty() || out.back() != shard) out.push_back(shard);
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

// Throws unless `order` (when set) orders no more samples than `shards` hold.
void check_order_fits(const char* what, const ShardSet& shards, const Permutation* order) {
  if (order && order->size() > shards.total_records()) {
    throw FastloadError(std::string(what) + ": an epoch order over " + std::to_string(order->size()) +
                        " samples, the shards hold " + std::to_string(shards.total_records()));
  }
}

// A planned stretch's hold on every shard of a lazy set (null for an eager one), so that none is detached
// before its batches are done. Throws when one is not attached: such batches are gated and submitted instead.
std::shared_ptr<const ShardPins> pin_every_shard(const char* what, const std::shared_ptr<const ShardSet>& shards) {
  if (!shards->lazy()) return nullptr;
  std::vector<size_t> all(shards->size());
  std::iota(all.begin(), all.end(), size_t{0});
  if (!shards->pin(all)) {
    throw FastloadError(std::string(what) + ": a lazy shard set's batches are planned only once every shard is "
                        "attached (submit them one by one until then)");
  }
  return std::make_shared<const ShardPins>(shards, std::move(all));
}

}  // namespace

struct BatchReader::Job {
  std::vector<uint64_t> indices;  // sample indices; positions of `order` when it is set
  std::shared_ptr<const Permutation> order;  // planned by position: the workers map them (plan())
  ShardPins pins;               // a lazy set's shards this batch reads (submit())
  std::shared_ptr<const ShardPins> plan_pins;  // a lazy set's every shard, held by each batch of a plan
  std::vector<int64_t> params;  // num_params per sample, with transforms
  std::shared_ptr<Slot> slot;
  size_t num_chunks = 0;
  std::atomic<size_t> next_chunk{0};
  std::atomic<size_t> chunks_left{0};
  std::exception_ptr error;     // guarded by BatchReader::mutex_
  size_t error_position = 0;    // guarded by BatchReader::mutex_
};

// plan_positions(): batches [next, stop) of plan, submitted after planned_.
struct BatchReader::RankCursor {
  RankPlan plan;
  size_t next, stop;
  std::shared_ptr<const Permutation> order;
  std::shared_ptr<const ShardPins> pins;  // a lazy set's every shard, held until these batches are done
};

// A worker's buffers for transforms: each transformed field decoded, and two
// buffers the steps alternate between.
struct BatchReader::Scratch {
  std::vector<std::vector<uint8_t>> decoded;
  std::vector<uint8_t> a, b;
  std::vector<uint64_t> indices;  // a chunk's sample indices, for a batch planned by position
};

BatchReader::BatchReader(std::shared_ptr<const ShardSet> shards, std::vector<FieldSpec> fields, ReaderOptions options)
    : shards_(std::move(shards)),
      fields_(std::move(fields)),
      transforms_(std::move(options.transforms)),
      capacity_(options.batch_capacity),
      decode_(options.decode_field),
      verify_(options.verify_checksums) {
  const size_t num_threads = options.num_threads;
  if (decode_.empty()) decode_.assign(fields_.size(), true);
  if (decode_.size() != fields_.size()) throw FastloadError("BatchReader: one decode flag per field");
  if (!shards_) throw FastloadError("BatchReader: no shards");
  if (transforms_ && transforms_->field_count() != fields_.size()) {
    throw FastloadError("BatchReader: the transforms were compiled for another number of fields");
  }
  if (capacity_ == 0) throw FastloadError("BatchReader: batch capacity must be positive");
  if (num_threads == 0) throw FastloadError("BatchReader: num_threads must be positive");
  for (size_t f = 0; f < fields_.size(); ++f) {
    if (static_cast<int>(fields_[f].codec) > kLastCodec) {
      throw FastloadError("BatchReader: unknown codec id " + std::to_string(static_cast<int>(fields_[f].codec)));
    }
    const bool transformed = transforms_ && f < fields_.size() && transforms_->transforms(f);
    if (transformed && transforms_->in_bytes(f) != fields_[f].decoded_bytes) {
      throw FastloadError("BatchReader: the transforms expect " + std::to_string(transforms_->in_bytes(f)) +
                          " decoded bytes for field " + std::to_string(f) + ", the schema has " +
                          std::to_string(fields_[f].decoded_bytes));
    }
    if (transformed && !decode_[f]) {
      throw FastloadError("BatchReader: transforms on field " + std::to_string(f) + ", which is not decoded");
    }
    sample_bytes_.push_back(transformed ? transforms_->out_bytes(f) : fields_[f].decoded_bytes);
  }
  // Validates the schema (item sizes, the sample-size bound) before any size is derived from it.
  decoder_options_ =
      DecoderOptions{verify_, options.max_sample_bytes, options.record_version, options.schema_fingerprint};
  const RecordDecoder schema_check(fields_, decoder_options_);
  const std::string what = "BatchReader: batch slot of " + std::to_string(capacity_) + " samples";
  // Every field's batch size (field_bytes(f), decoded or not) fits in size_t.
  static_cast<void>(mul_or_raise<FastloadError>(capacity_, static_cast<size_t>(schema_check.sample_bytes()), what));
  for (size_t f = 0; f < fields_.size(); ++f) {
    offsets_.push_back(slot_bytes_);
    if (!decode_[f]) continue;
    const auto bytes = static_cast<size_t>(sample_bytes_[f]);
    const size_t field_bytes = mul_or_raise<FastloadError>(capacity_, bytes, what);
    const size_t end = add_or_raise<FastloadError>(slot_bytes_, field_bytes, what);
    slot_bytes_ = align_up_or_raise<FastloadError>(end, kAlign, what);
  }
  slot_bytes_ = std::max(slot_bytes_, kAlign);
  if (slot_bytes_ > physical_memory_bytes()) {
    throw FastloadError(what + " needs " + std::to_string(slot_bytes_) + " bytes, more than this machine's memory (" +
                        std::to_string(physical_memory_bytes()) + " bytes)");
  }
  fingerprints_ = std::move(options.shard_fingerprints);
  if (options.record_version >= 3 && fingerprints_.size() != shards_->size()) {
    throw FastloadError("BatchReader: format 3 records need one binding fingerprint per shard (" +
                        std::to_string(shards_->size()) + " shards, " + std::to_string(fingerprints_.size()) +
                        " fingerprints)");
  }
  if (fingerprints_.empty()) fingerprints_.assign(shards_->size(), options.schema_fingerprint);
  if (fingerprints_.size() != shards_->size()) {
    throw FastloadError("BatchReader: " + std::to_string(fingerprints_.size()) + " shard fingerprints for " +
                        std::to_string(shards_->size()) + " shards");
  }
  // Enough chunks per batch that every thread has several to take, but no
  // chunk under kMinChunkBytes of output: with many threads and small
  // records, tiny chunks cost more to hand out than to decode.
  size_t sample_bytes = 0;
  for (size_t f = 0; f < fields_.size(); ++f) sample_bytes += decode_[f] ? static_cast<size_t>(sample_bytes_[f]) : 0;
  const size_t min_samples = std::max<size_t>(1, kMinChunkBytes / std::max<size_t>(1, sample_bytes));
  max_running_ = options.max_running == 0 ? num_threads : std::min(options.max_running, num_threads);
  chunk_size_ = std::max({size_t{1}, capacity_ / (max_running_ * 4), std::min(min_samples, capacity_)});
  pool_ = options.pool && options.pool->slot_bytes() == slot_bytes_ ? std::move(options.pool)
                                                                     : std::make_shared<SlotPool>(slot_bytes_);
  worker_cv_ = std::make_unique<std::condition_variable[]>(num_threads);
  woken_.assign(num_threads, 0);
  idle_.reserve(num_threads);
  try {
    for (size_t i = 0; i < num_threads; ++i) workers_.emplace_back([this, i] {
        name_this_thread("fastload-w" + std::to_string(i));
        worker_main(i);
      });
  } catch (...) {
    close();
    throw;
  }
}

BatchReader::~BatchReader() { close(); }

void BatchReader::close() noexcept {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    stop_flag_.store(true);
    work_.clear();
  }
  for (size_t i = 0; i < workers_.size(); ++i) worker_cv_[i].notify_all();
  done_cv_.notify_all();
  for (std::thread& t : workers_) {
    if (t.joinable()) t.join();
  }
  // Workers are gone: nothing writes into the slots any more. The jobs are
  // dropped outside the lock: freeing a slot may take the GIL, which a thread
  // reading ready() or pending() may hold while it waits for this lock.
  std::deque<std::shared_ptr<Job>> dropped, planned;
  std::unique_ptr<RankCursor> cursor;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    dropped.swap(inflight_);
    planned.swap(planned_);
    cursor.swap(cursor_);
  }
}

bool BatchReader::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stop_;
}

size_t BatchReader::ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ready_locked(inflight_.size());
}

size_t BatchReader::ready_locked(size_t at_most) const {
  size_t count = 0;
  for (const auto& job : inflight_) {
    if (count == at_most || job->chunks_left.load() != 0) break;
    ++count;
  }
  return count;
}

size_t BatchReader::wake_after_locked() const {
  // The first batch wakes the consumer at once (time to first batch); after it, a consumer that has to wait
  // sleeps until three quarters of the window are ready (all but one batch of a window under 8), so that it
  // blocks (two context switches, 13 to 25 us of its CPU on this virtual machine) once per several batches,
  // not once per batch. The workers keep the rest of the window to work on while it wakes up and takes the
  // ready ones (a few microseconds each); a consumer slower than them never waits at all.
  const size_t window = window_locked();
  const size_t batches = delivered_any_ ? std::max<size_t>(1, window - std::max<size_t>(1, window / kWorkShare)) : 1;
  return std::min(batches, inflight_.size());
}

size_t BatchReader::pending() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return inflight_.size();
}

void BatchReader::add_split_slot(const std::vector<std::pair<uint8_t*, size_t>>& buffers,
                                 std::shared_ptr<void> owner, bool reusable) {
  if (buffers.size() != fields_.size()) {
    throw FastloadError("add_split_slot: " + std::to_string(buffers.size()) + " buffers for " +
                        std::to_string(fields_.size()) + " fields");
  }
  std::vector<uint8_t*> data(fields_.size(), nullptr);
  for (size_t f = 0; f < fields_.size(); ++f) {
    if (!decode_[f]) continue;
    if (buffers[f].first == nullptr || buffers[f].second < field_bytes(f)) {
      throw FastloadError("add_split_slot: field " + std::to_string(f) + " needs a buffer of " +
                          std::to_string(field_bytes(f)) + " bytes, got " + std::to_string(buffers[f].second));
    }
    data[f] = buffers[f].first;
  }
  pool_->add_split(std::move(data), std::move(owner), reusable);
}

void BatchReader::check_batch(const char* what, const uint64_t* indices, size_t count, size_t params,
                              const Permutation* order) const {
  const size_t per_sample = transforms_ ? transforms_->num_params() : 0;
  if (params != count * per_sample) {
    throw FastloadError(std::string(what) + ": " + std::to_string(params) + " transform parameters for " +
                        std::to_string(count) + " samples, expected " + std::to_string(per_sample) + " per sample");
  }
  if (count > capacity_) {
    throw FastloadError(std::string(what) + ": " + std::to_string(count) + " samples exceed the batch capacity " +
                        std::to_string(capacity_));
  }
  const uint64_t total = order != nullptr ? order->size() : shards_->total_records();
  for (size_t i = 0; i < count; ++i) {
    if (indices[i] >= total) {
      throw FastloadError(std::string(what) + ": " + (order != nullptr ? "epoch position " : "sample index ") +
                          std::to_string(indices[i]) + " out of range for " + std::to_string(total) + " samples");
    }
  }
}

std::shared_ptr<BatchReader::Job> BatchReader::make_job(std::vector<uint64_t> indices,
                                                        std::vector<int64_t> params) const {
  auto job = std::make_shared<Job>();
  job->indices = std::move(indices);
  job->params = std::move(params);
  job->num_chunks = (job->indices.size() + chunk_size_ - 1) / chunk_size_;
  job->chunks_left.store(job->num_chunks);
  return job;
}

void BatchReader::start_locked(std::shared_ptr<Job> job) {
  inflight_.push_back(job);
  if (job->num_chunks > 0) work_.push_back(std::move(job));
}

void BatchReader::wake_locked() {
  // Wake no more workers than there are chunks to take: waking all of them
  // for a small batch costs more context switches than the batch takes to
  // decode when there are more threads than cores. A busy worker moves on to
  // the next job by itself.
  size_t chunks = 0;
  for (const auto& job : work_) {
    chunks += job->num_chunks - std::min(job->num_chunks, job->next_chunk.load(std::memory_order_relaxed));
    if (chunks >= idle_.size()) break;
  }
  const size_t most = turns_locked();
  const size_t turns = most - std::min(most, running_);
  const size_t wake = std::min({chunks, idle_.size(), turns});
  for (size_t i = 0; i < wake; ++i) {  // the last to go idle first, each with a turn of its own
    const size_t worker = idle_.back();
    idle_.pop_back();
    woken_[worker] = 1;
    take_turn_locked();
    worker_cv_[worker].notify_one();
  }
}

bool BatchReader::submit(std::vector<uint64_t> indices, std::vector<int64_t> params) {
  check_batch("submit", indices.data(), indices.size(), params.size(), nullptr);
  std::shared_ptr<Job> job = make_job(std::move(indices), std::move(params));
  if (shards_->lazy()) {  // every shard the batch reads stays attached until it is delivered
    std::vector<size_t> read = shards_of(*shards_, job->indices);
    if (!shards_->pin(read)) return false;
    job->pins = ShardPins(shards_, std::move(read));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_) throw FastloadError("submit: the reader is closed");
  if (planned_locked() > 0) {
    throw FastloadError("submit: planned batches come first (plan() and submit() do not mix)");
  }
  job->slot = pool_->try_acquire();
  if (!job->slot) throw FastloadError("submit: no free batch buffer (add a slot first)");
  start_locked(std::move(job));
  wake_locked();
  return true;
}

void BatchReader::plan(const std::vector<uint64_t>& indices, const std::vector<size_t>& sizes,
                       const std::vector<int64_t>& params, std::shared_ptr<const Permutation> order) {
  check_order_fits("plan", *shards_, order.get());
  const size_t per_sample = transforms_ ? transforms_->num_params() : 0;
  size_t total = 0;
  for (size_t size : sizes) {
    if (size == 0 || size > capacity_) {
      throw FastloadError("plan: a batch of " + std::to_string(size) + " samples (capacity " +
                          std::to_string(capacity_) + ")");
    }
    total += size;  // each at most the capacity: no overflow before it passes indices.size()
    if (total > indices.size()) break;
  }
  if (total != indices.size()) {
    throw FastloadError("plan: the batch sizes do not add up to the " + std::to_string(indices.size()) + " indices");
  }
  if (params.size() != total * per_sample) {
    throw FastloadError("plan: " + std::to_string(params.size()) + " transform parameters for " +
                        std::to_string(total) + " samples, expected " + std::to_string(per_sample) + " per sample");
  }
  // A lazy set: every shard attached, and kept so until these batches are delivered or dropped.
  const std::shared_ptr<const ShardPins> plan_pins = pin_every_shard("plan", shards_);
  std::vector<std::shared_ptr<Job>> jobs;
  jobs.reserve(sizes.size());
  size_t at = 0;
  for (size_t size : sizes) {
    check_batch("plan", indices.data() + at, size, size * per_sample, order.get());
    jobs.push_back(make_job(std::vector<uint64_t>(indices.begin() + static_cast<std::ptrdiff_t>(at),
                                                  indices.begin() + static_cast<std::ptrdiff_t>(at + size)),
                            std::vector<int64_t>(params.begin() + static_cast<std::ptrdiff_t>(at * per_sample),
                                                 params.begin() + static_cast<std::ptrdiff_t>((at + size) * per_sample))));
    jobs.back()->order = order;
    jobs.back()->plan_pins = plan_pins;
    at += size;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_) throw FastloadError("plan: the reader is closed");
  if (cursor_ && cursor_->next < cursor_->stop) {
    throw FastloadError("plan: the batches of a RankPlan are still to be read (plan_positions() comes last)");
  }
  for (auto& job : jobs) planned_.push_back(std::move(job));
  submit_planned_locked();
  wake_locked();
}

void BatchReader::plan_positions(const RankPlan& plan, size_t first, size_t stop,
                                 std::shared_ptr<const Permutation> order) {
  check_order_fits("plan_positions", *shards_, order.get());
  if (transforms_ && transforms_->num_params() > 0) {
    throw FastloadError("plan_positions: the transforms draw parameters per sample (plan() them instead)");
  }
  if (first > stop || stop > plan.batch_count()) {
    throw FastloadError("plan_positions: batches " + std::to_string(first) + " to " + std::to_string(stop) +
                        " of a plan of " + std::to_string(plan.batch_count()));
  }
  if (plan.batch_size() > capacity_) {
    throw FastloadError("plan_positions: batches of " + std::to_string(plan.batch_size()) + " samples (capacity " +
                        std::to_string(capacity_) + ")");
  }
  const uint64_t bound = order ? order->size() : shards_->total_records();
  if (first < stop && plan.end() > bound) {
    throw FastloadError("plan_positions: " + std::string(order ? "epoch position " : "sample index ") +
                        std::to_string(plan.end() - 1) + " out of range for " + std::to_string(bound) + " samples");
  }
  auto cursor = std::make_unique<RankCursor>(
      RankCursor{plan, first, stop, std::move(order), pin_every_shard("plan_positions", shards_)});  // as plan()
  std::unique_ptr<RankCursor> previous;
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_) throw FastloadError("plan_positions: the reader is closed");
  if (planned_locked() > 0) throw FastloadError("plan_positions: planned batches are still to be read");
  previous.swap(cursor_);  // a spent cursor: dropped after the lock (its pins)
  cursor_ = std::move(cursor);
  submit_planned_locked();
  wake_locked();
}

void BatchReader::set_window(size_t window, size_t first_window) {
  std::lock_guard<std::mutex> lock(mutex_);
  window_ = std::max<size_t>(1, window);
  first_window_ = std::max<size_t>(1, first_window);
}

size_t BatchReader::window_locked() const { return delivered_any_ ? window_ : std::min(window_, first_window_); }

void BatchReader::submit_planned_locked() {
  if (stop_) return;  // closed: a worker on its way to idle must not start a batch close() would not drop
  const size_t window = window_locked();
  while (planned_locked() > 0 && inflight_.size() < window) {
    std::shared_ptr<Slot> slot = pool_->try_acquire();
    if (!slot) return;
    std::shared_ptr<Job> job;
    if (!planned_.empty()) {
      job = std::move(planned_.front());
      planned_.pop_front();
    } else {  // the RankPlan's next batch, worked out now (checked as a whole by plan_positions)
      job = make_job(cursor_->plan.positions(cursor_->next++), {});
      job->order = cursor_->order;
      job->plan_pins = cursor_->pins;
    }
    job->slot = std::move(slot);
    start_locked(std::move(job));
  }
}

void BatchReader::refill_locked() {
  submit_planned_locked();
  // work_ may still hold a finished job (a worker drops it once it finds no chunk left), even with
  // nothing in flight.
  if (idle_.empty() || work_.empty() || inflight_.empty()) return;
  // A consumer back from a sleep left the workers only the last quarter of the window (wake_after_locked):
  // workers that ran out of chunks meanwhile are woken for the first batch its takes submit, not once it
  // has taken half the window. At most one wake per sleep, and none while every worker is busy (the common
  // case: a consumer that sleeps is faster than the workers).
  if (wake_workers_after_sleep_ &&
      work_.back()->next_chunk.load(std::memory_order_relaxed) < work_.back()->num_chunks) {
    wake_workers_after_sleep_ = false;
    wake_locked();
    return;
  }
  // Idle workers are woken once half the window is left to them (batches not
  // yet taken up), or while the oldest batch has chunks nobody took (the
  // consumer is about to wait for it), not for every batch the window moves
  // on: a wake is a system call, and on a virtual machine an interrupt to
  // another CPU, a large part of the consumer's work per batch.
  const size_t taken = inflight_.size() - std::min(inflight_.size(), work_.size());
  const Job& oldest = *inflight_.front();
  if (taken * 2 <= window_locked() || oldest.next_chunk.load(std::memory_order_relaxed) < oldest.num_chunks) {
    wake_locked();
  }
}

size_t BatchReader::planned() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return planned_locked();
}

size_t BatchReader::planned_locked() const {
  return planned_.size() + (cursor_ ? cursor_->stop - cursor_->next : 0);
}

size_t BatchReader::slots_wanted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  const size_t room = window_locked() - std::min(window_locked(), inflight_.size());
  const size_t wanted = std::min(room, planned_locked());
  const size_t free = pool_->free_count();
  return wanted > free ? wanted - free : 0;
}

void BatchReader::submit_planned() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stop_) throw FastloadError("submit_planned: the reader is closed");
  refill_locked();
}

bool BatchReader::next_ready() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stop_ || inflight_.empty() || inflight_.front()->chunks_left.load() == 0;
}

std::optional<CompletedBatch> BatchReader::wait_next(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mutex_);
  if (stop_) throw FastloadError("wait_next: the reader is closed");
  refill_locked();
  if (inflight_.empty()) {
    throw FastloadError(planned_locked() == 0 ? "wait_next: no batch was submitted"
                                         : "wait_next: no free batch buffer for the next planned batch (add a slot)");
  }
  bool ready = inflight_.front()->chunks_left.load() == 0;
  if (!ready && timeout.count() > 0) {
    wake_workers_after_sleep_ = true;
    consumer_wants_ = wake_after_locked();
    ready = done_cv_.wait_for(lock, timeout, [this] {
      return stop_ || inflight_.empty() || ready_locked(consumer_wants_) == consumer_wants_;
    });
    consumer_wants_ = 0;
  }
  wait_ns_.fetch_add(elapsed_ns(start), std::memory_order_relaxed);
  if (stop_) throw FastloadError("wait_next: the reader was closed");
  if (!ready) return std::nullopt;
  if (inflight_.empty()) throw FastloadError("wait_next: the batch was taken by another thread");
  std::shared_ptr<Job> job = std::move(inflight_.front());
  inflight_.pop_front();
  delivered_any_ = true;
  refill_locked();  // the window moves on by one (a slot the consumer gave back since, if any)
  lock.unlock();
  job->pins.release();  // every chunk is done: its shards may be detached from now on
  job->plan_pins.reset();  // (a plan's: once its last batch is delivered)
  if (job->error) {
    // Every chunk is done: no worker touches the slot. It goes back to the
    // pool here, on the consumer's thread, not on whichever worker drops the
    // job last.
    job->slot.reset();
    std::rethrow_exception(job->error);
  }
  batches_.fetch_add(1, std::memory_order_relaxed);
  return CompletedBatch{std::move(job->slot), job->indices.size()};
}

void BatchReader::take_turn_locked() {
  ++running_;
  peak_running_ = std::max(peak_running_, running_);
}

namespace {

int64_t steady_ns(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// A chunk at least this slow is checked for reads from disk: a major fault takes tens of microseconds
// (60 on this project's VM, more on a real disk or a network file system); most chunks of data in
// memory take less, so the system call is rare there.
constexpr auto kSlowChunk = std::chrono::microseconds(50);
constexpr int64_t kDiskHoldNs = 1'000'000'000;  // every worker runs this long after the last read seen

}  // namespace

size_t BatchReader::turns_locked() const {
  if (max_running_ >= workers_.size()) return max_running_;
  const int64_t until = disk_until_ns_.load(std::memory_order_relaxed);
  return until != 0 && steady_ns(std::chrono::steady_clock::now()) < until ? workers_.size() : max_running_;
}

void BatchReader::note_disk_reads(std::chrono::steady_clock::time_point start, uint64_t& seen) {
  const auto now = std::chrono::steady_clock::now();
  if (now - start < kSlowChunk) return;
  if (disk_reads_for_tests_.load(std::memory_order_relaxed)) {
    ++seen;
  } else {
    const std::optional<uint64_t> faults = thread_disk_faults();
    if (!faults || *faults == seen) return;
    seen = *faults;
  }
  disk_chunks_.fetch_add(1, std::memory_order_relaxed);
  const int64_t until = steady_ns(now) + kDiskHoldNs;
  if (disk_until_ns_.exchange(until) > steady_ns(now)) return;  // already running every worker
  std::lock_guard<std::mutex> lock(mutex_);
  wake_locked();  // more turns now: idle workers for the queued chunks
}

void BatchReader::worker_main(size_t index) {
  RecordDecoder decoder(fields_, decoder_options_);
  Scratch scratch;
  if (transforms_) {
    scratch.decoded.resize(fields_.size());
    for (size_t f = 0; f < fields_.size(); ++f) {
      if (transforms_->transforms(f)) scratch.decoded[f].resize(static_cast<size_t>(fields_[f].decoded_bytes));
    }
    scratch.a.resize(transforms_->scratch_bytes());
    scratch.b.resize(transforms_->scratch_bytes());
  }
  std::shared_ptr<Job> job;
  bool turn = false;  // this worker holds one of the max_running_ turns
  // Reads from disk are looked for only where turns limit the workers, and where the system counts them.
  std::optional<uint64_t> disk_faults;
  if (max_running_ < workers_.size()) disk_faults = thread_disk_faults().value_or(0);
  for (;;) {
    if (!job) {
      std::unique_lock<std::mutex> lock(mutex_);
      submit_planned_locked();  // a free slot and room in the window: the next planned batch, with no wake
      for (;;) {
        if (stop_) return;
        if (turn && !work_.empty()) break;  // work, and a turn to do it in (kept from the last job, or given)
        if (turn) {  // no work left: the turn goes back
          --running_;
          turn = false;
        }
        if (!work_.empty() && running_ < turns_locked()) {  // work, and a turn free: no need to sleep
          take_turn_locked();
          turn = true;
          continue;
        }
        idle_.push_back(index);
        worker_cv_[index].wait(lock, [this, index] { return stop_ || woken_[index] != 0; });
        if (stop_) return;
        woken_[index] = 0;
        turn = true;  // wake_locked() took it off idle_ and counted its turn in running_
      }
      job = work_.front();
    }
    const size_t chunk = job->next_chunk.fetch_add(1);
    if (chunk >= job->num_chunks) {  // every chunk of this job is taken: on to the next job
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!work_.empty() && work_.front() == job) work_.pop_front();
      }
      // Outside the lock: dropping the last reference may free a slot whose
      // owner takes the GIL, and the consumer may hold the GIL while it waits
      // for this lock.
      job.reset();
      continue;
    }
    std::exception_ptr error;
    // Timed only where disk reads are looked for (turns limit the workers, the system counts faults).
    const auto chunk_start = disk_faults ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
    try {
      run_chunk(*job, chunk, decoder, scratch);
    } catch (...) {
      error = std::current_exception();
    }
    if (disk_faults) note_disk_reads(chunk_start, *disk_faults);
    if (error) {
      std::lock_guard<std::mutex> lock(mutex_);
      const size_t position = chunk * chunk_size_;
      if (!job->error || position < job->error_position) {
        job->error = error;
        job->error_position = position;
      }
    }
    if (job->chunks_left.fetch_sub(1) == 1) {
      // The consumer checks chunks_left under the lock: deciding here under it means the notification
      // cannot fall between its check and its wait. It is woken only once the batches it waits for are
      // all ready (a wake is a system call and, for the consumer, two context switches).
      bool wake = false;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        wake = consumer_wants_ > 0 && ready_locked(consumer_wants_) == consumer_wants_;
      }
      if (wake) done_cv_.notify_all();
    }
    if (stop_flag_.load(std::memory_order_relaxed)) return;
  }
}

void BatchReader::run_chunk(Job& job, size_t chunk, RecordDecoder& decoder, Scratch& scratch) {
  const size_t begin = chunk * chunk_size_;
  const size_t end = std::min(begin + chunk_size_, job.indices.size());
  // index[i] for i in [begin, end): the sample indices, mapped here from epoch positions when the batch was
  // planned by position (the epoch order's cost then falls on the workers, not on the consumer).
  const uint64_t* index = job.indices.data();
  if (job.order) {
    scratch.indices.resize(job.indices.size());
    for (size_t i = begin; i < end; ++i) scratch.indices[i] = (*job.order)(job.indices[i]);
    index = scratch.indices.data();
  }
  std::vector<uint8_t*> dest(fields_.size());
  std::vector<uint8_t*> out(fields_.size());  // the slot rows; dest differs for transformed fields
  uint64_t read_ns = 0, decode_ns = 0, bytes_read = 0, transform_ns = 0;
  const uint64_t decompress_before = decoder.decompress_ns();
  // One clock read per stage boundary, each stage's end the next one's start: reading the clock is a
  // noticeable part of a small record's cost (about a tenth with two reads per stage).
  auto mark = std::chrono::steady_clock::now();
  const auto lap = [&mark](uint64_t& total) {
    const auto now = std::chrono::steady_clock::now();
    total += static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark).count());
    mark = now;
  };
  for (size_t i = begin; i < end; ++i) {
    if (i + 1 < end) shards_->prefetch(index[i + 1]);
    const auto [shard, key] = shards_->locate(index[i]);
    const ShardFile& file = shards_->shard(shard);
    if (const uint32_t delay = read_delay_us_.load(std::memory_order_relaxed); delay != 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(delay));  // tests only (set_read_delay_for_tests)
    }
    lap(read_ns);
    for (size_t f = 0; f < fields_.size(); ++f) {
      if (!decode_[f]) {
        dest[f] = out[f] = nullptr;
        continue;
      }
      uint8_t* base = job.slot->field_data.empty() ? job.slot->data + offsets_[f] : job.slot->field_data[f];
      out[f] = base + i * static_cast<size_t>(sample_bytes_[f]);
      dest[f] = transforms_ && transforms_->transforms(f) ? scratch.decoded[f].data() : out[f];
    }
    try {
      const MappedReadScope reading(file.mapping());
      const auto [data, size] = file.record(key);
      bytes_read += size;
      decoder.decode(data, size, dest.data(), key, fingerprints_[shard]);
    } catch (const DecodeError& err) {
      file.check_unchanged_after_error();  // damage read from a shard that changed: say so
      throw CorruptRecordError(file.path(), key, err.what());
    }
    file.check_unchanged();
    lap(decode_ns);
    if (transforms_) {
      const int64_t* params = job.params.data() + i * transforms_->num_params();
      for (size_t f = 0; f < fields_.size(); ++f) {
        if (dest[f] != out[f]) transforms_->run(f, dest[f], out[f], params, scratch.a.data(), scratch.b.data());
      }
      lap(transform_ns);
    }
  }
  uint64_t decoded = 0;
  for (size_t f = 0; f < fields_.size(); ++f) decoded += decode_[f] ? sample_bytes_[f] * (end - begin) : 0;
  samples_.fetch_add(end - begin, std::memory_order_relaxed);
  bytes_read_.fetch_add(bytes_read, std::memory_order_relaxed);
  bytes_decoded_.fetch_add(decoded, std::memory_order_relaxed);
  read_ns_.fetch_add(read_ns, std::memory_order_relaxed);
  decode_ns_.fetch_add(decode_ns, std::memory_order_relaxed);
  decompress_ns_.fetch_add(decoder.decompress_ns() - decompress_before, std::memory_order_relaxed);
  transform_ns_.fetch_add(transform_ns, std::memory_order_relaxed);
}

ReaderStats BatchReader::stats() const {
  ReaderStats s;
  s.batches = batches_.load();
  s.samples = samples_.load();
  s.bytes_read = bytes_read_.load();
  s.bytes_decoded = bytes_decoded_.load();
  s.read_ns = read_ns_.load();
  s.decode_ns = decode_ns_.load();
  s.decompress_ns = decompress_ns_.load();
  s.wait_ns = wait_ns_.load();
  s.disk_chunks = disk_chunks_.load();
  s.transform_ns = transform_ns_.load();
  std::lock_guard<std::mutex> lock(mutex_);
  s.peak_running = peak_running_;
  return s;
}

void BatchReader::reset_stats() {
  for (auto* c : {&batches_, &samples_, &bytes_read_, &bytes_decoded_, &read_ns_, &decode_ns_, &decompress_ns_,
                  &wait_ns_, &transform_ns_, &disk_chunks_}) {
    c->store(0);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  peak_running_ = running_;
}

}  // namespace fastload
