#include "reader/shard_reader.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <string>
#include <system_error>
#include <thread>

#include "checked_math.h"
#include "errors.h"
#include "format/record_blocks.h"
#include "platform/platform.h"

namespace fastload {
namespace {

// How much of a record prefetch() asks for: the header and the first lines.
// Measured on 3x32x32 records (docs in csrc/README.md): 512 bytes one record
// ahead halves the copy time; 4 KiB stalls on the line fill buffers instead.
constexpr size_t kPrefetchBytes = 512;
constexpr size_t kPageBytes = 4096;  // the hardware prefetcher's reach: it does not cross a page

// Threads opening the shards of an eager ShardSet at once, at most (and no more than the CPUs).
constexpr size_t kOpenThreads = 8;

// Joins every joinable thread of `threads` when it goes out of scope.
class ThreadJoiner {
 public:
  explicit ThreadJoiner(std::vector<std::thread>& threads) noexcept : threads_(threads) {}
  ~ThreadJoiner() {
    for (std::thread& t : threads_) {
      if (t.joinable()) t.join();
    }
  }
  ThreadJoiner(const ThreadJoiner&) = delete;
  ThreadJoiner& operator=(const ThreadJoiner&) = delete;

 private:
  std::vector<std::thread>& threads_;
};

}  // namespace

ShardFile::ShardFile(std::string path, uint64_t expected_records, bool packed)
    : path_(std::move(path)), mapping_(std::make_unique<FileMapping>(path_)) {
  {
    const MappedReadScope reading(*mapping_);
    try {
      layout_ = validate_lmdb(mapping_->data(), mapping_->size(), packed ? kAnyEntryCount : expected_records, path_,
                              RunHeaders::when_read);
      if (packed) {  // v4: the entries are blocks; their headers and indexes give each record's span
        spans_ = unpack_blocks(mapping_->data(), layout_.records, layout_.page_size, expected_records, kBlockVersion,
                               path_);
      } else {
        spans_ = std::move(layout_.records);
      }
    } catch (const CorruptShardError&) {
      mapping_->check_unchanged_after_error(path_);  // a walk over a changed file fails: say why
      throw;
    }
  }
  mapping_->check_unchanged(path_);
  layout_.records.clear();
  layout_.records.shrink_to_fit();
  map_ = mapping_->data();
}

ShardFile::~ShardFile() = default;

void ShardFile::throw_missing(uint64_t key) const {
  throw CorruptRecordError(path_, key, "key not found in the shard (it holds " + std::to_string(spans_.size()) +
                                           " records)");
}

void ShardFile::throw_bad_run(uint64_t key) const {
  const std::string problem = run_header_problem(map_, spans_[key], layout_.page_size);
  mapping_->check_unchanged_after_error(path_);  // damage read from a file that changed: say so
  throw CorruptRecordError(path_, key, problem);
}

ShardLayout validate_shard_file(const std::string& path, uint64_t expected_records, bool packed) {
  const FileMapping mapping(path);
  ShardLayout layout;
  {
    const MappedReadScope reading(mapping);
    try {
      layout = validate_lmdb(mapping.data(), mapping.size(), packed ? kAnyEntryCount : expected_records, path);
      if (packed) static_cast<void>(unpack_blocks(mapping.data(), layout.records, layout.page_size, expected_records,
                                                  kBlockVersion, path));
    } catch (const CorruptShardError&) {
      mapping.check_unchanged_after_error(path);  // a walk over a changed file fails: say why
      throw;
    }
  }
  mapping.check_unchanged(path);
  layout.records.clear();
  layout.records.shrink_to_fit();
  return layout;
}

ShardSet::ShardSet(const std::vector<std::string>& paths, const std::vector<uint64_t>& counts,
                   const std::vector<bool>& packed)
    : files_(counts.size()), owned_(counts.size()), packed_(packed) {
  if (paths.size() != counts.size() || packed.size() != counts.size()) {
    throw FastloadError("ShardSet: paths, counts and packed differ in length");
  }
  set_counts(counts);
  open_all(paths, counts);
  for (size_t i = 0; i < paths.size(); ++i) files_[i].store(owned_[i].get(), std::memory_order_release);
}

void ShardSet::open_all(const std::vector<std::string>& paths, const std::vector<uint64_t>& counts) {
  // Each shard is mapped and its B-tree walked (page faults, mostly): the shards are opened by up to
  // kOpenThreads threads at once, this one included, each taking the next shard not yet taken. The error
  // thrown is that of the lowest shard that failed, as opening them in order would throw: once one fails
  // no new shard is taken, and every shard below it was taken before it and is finished first.
  const size_t n = paths.size();
  std::vector<std::exception_ptr> errors(n);
  std::atomic<size_t> next{0};
  const auto open_some = [&]() noexcept {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) {
      try {
        owned_[i] = std::make_unique<ShardFile>(paths[i], counts[i], packed_[i]);
      } catch (...) {
        errors[i] = std::current_exception();
        next.store(n);
      }
    }
  };
  const size_t cores = std::max<size_t>(1, std::thread::hardware_concurrency());
  const size_t helpers = std::min({n, cores, kOpenThreads}) - std::min<size_t>(1, n);
  {
    std::vector<std::thread> threads;
    const ThreadJoiner joiner(threads);  // joined on every way out, before `errors` and `next` go
    try {
      for (size_t t = 0; t < helpers; ++t) threads.emplace_back(open_some);
    } catch (const std::system_error&) {
      // No thread to be had: the threads started, and this one, open the rest.
    }
    open_some();
  }
  for (const std::exception_ptr& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

ShardSet::ShardSet(const std::vector<uint64_t>& counts, const std::vector<bool>& packed)
    : files_(counts.size()), owned_(counts.size()), pins_(counts.size(), 0), lazy_(true), packed_(packed) {
  if (packed.size() != counts.size()) throw FastloadError("ShardSet: counts and packed differ in length");
  set_counts(counts);
  for (auto& file : files_) file.store(nullptr, std::memory_order_relaxed);
}

void ShardSet::set_counts(const std::vector<uint64_t>& counts) {
  offsets_.reserve(counts.size() + 1);
  offsets_.push_back(0);
  for (uint64_t count : counts) {
    uint64_t next = 0;
    if (!checked_add(offsets_.back(), count, &next)) throw FastloadError("ShardSet: record counts overflow");
    offsets_.push_back(next);
  }
}

const ShardFile& ShardSet::shard(size_t i) const {
  if (i >= files_.size()) {
    throw FastloadError("shard " + std::to_string(i) + " out of range for " + std::to_string(files_.size()) +
                        " shards");
  }
  const ShardFile* file = files_[i].load(std::memory_order_acquire);
  if (file == nullptr) {
    throw FastloadError("shard " + std::to_string(i) + " is not fetched yet: a batch read it before its download "
                        "was attached");
  }
  return *file;
}

void ShardSet::attach(size_t i, const std::string& path) {
  if (i >= files_.size()) {
    throw FastloadError("ShardSet.attach: shard " + std::to_string(i) + " out of range for " +
                        std::to_string(files_.size()) + " shards");
  }
  if (attached(i)) return;
  auto file = std::make_unique<ShardFile>(path, offsets_[i + 1] - offsets_[i], packed_[i]);  // validates, unlocked
  const std::lock_guard<std::mutex> lock(attach_mutex_);
  if (owned_[i] != nullptr) return;  // attached meanwhile by another thread: keep the first
  owned_[i] = std::move(file);
  files_[i].store(owned_[i].get(), std::memory_order_release);
}

bool ShardSet::pin(const std::vector<size_t>& shards) const {
  if (!lazy_) return true;
  const std::lock_guard<std::mutex> lock(attach_mutex_);
  for (size_t i : shards) {
    if (i >= files_.size() || owned_[i] == nullptr) return false;
  }
  for (size_t i : shards) ++pins_[i];
  return true;
}

void ShardSet::unpin(const std::vector<size_t>& shards) const noexcept {
  if (!lazy_) return;
  const std::lock_guard<std::mutex> lock(attach_mutex_);
  for (size_t i : shards) {
    if (i < pins_.size() && pins_[i] > 0) --pins_[i];
  }
}

bool ShardSet::detach(size_t i) {
  if (i >= files_.size()) {
    throw FastloadError("ShardSet.detach: shard " + std::to_string(i) + " out of range for " +
                        std::to_string(files_.size()) + " shards");
  }
  if (!lazy_) throw FastloadError("ShardSet.detach: an eager set's shards stay attached");
  std::unique_ptr<ShardFile> closed;  // unmapped after the lock is released
  {
    const std::lock_guard<std::mutex> lock(attach_mutex_);
    if (pins_[i] > 0) return false;
    files_[i].store(nullptr, std::memory_order_release);
    closed = std::move(owned_[i]);
  }
  return true;
}

std::pair<size_t, uint64_t> ShardSet::locate(uint64_t global_index) const {
  if (global_index >= total_records()) {
    throw FastloadError("sample index " + std::to_string(global_index) + " out of range for " +
                        std::to_string(total_records()) + " samples");
  }
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), global_index);
  const size_t shard = static_cast<size_t>(it - offsets_.begin()) - 1;
  return {shard, global_index - offsets_[shard]};
}

void ShardSet::prefetch(uint64_t global_index) const noexcept {
  if (global_index >= total_records()) return;
  const auto it = std::upper_bound(offsets_.begin(), offsets_.end(), global_index);
  const size_t shard = static_cast<size_t>(it - offsets_.begin()) - 1;
  const ShardFile* file = files_[shard].load(std::memory_order_acquire);
  if (file == nullptr) return;
  const uint64_t key = global_index - offsets_[shard];
  if (key >= file->records()) return;
  const auto [data, size] = file->record_location(key);
  // The header and the first lines of the payload; the hardware prefetcher
  // follows the rest of a long record once the copy streams through it.
  const size_t bytes = std::min<size_t>(size, kPrefetchBytes);
  for (size_t off = 0; off < bytes; off += 64) prefetch_for_read(data + off);
  // A record running onto the next 4 KiB page (format 4 packs records across pages): the hardware
  // prefetcher does not follow a stream across a page, so the first lines past it are asked for too.
  const size_t into_page = reinterpret_cast<uintptr_t>(data) & (kPageBytes - 1);
  const size_t to_boundary = kPageBytes - into_page;
  if (to_boundary >= bytes && to_boundary < size) {
    const size_t more = std::min<size_t>(size - to_boundary, kPrefetchBytes);
    for (size_t off = 0; off < more; off += 64) prefetch_for_read(data + to_boundary + off);
  }
}

}  // namespace fastload
