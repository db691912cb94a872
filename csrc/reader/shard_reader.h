// ShardSet and ShardFile: read-only access to the LMDB shards of one dataset,
// without liblmdb.
//
// A ShardFile maps one shard file read-only and validates its whole LMDB
// structure once (lmdb_validator.h) before any record is read, but for the
// header of each record's overflow run, checked when the record is read
// (record()): it lies on the record's own first page, so the validation walk
// reads only the tree's pages, not a page of every record. The walk
// learns where every record's value lies in the file, so a read is an index
// into the mapping: no B-tree descent, no read transaction, and no LMDB code
// running on untrusted pages. Shards are immutable, so there is nothing else
// LMDB would add for a reader. A file that shrinks while mapped is caught:
// every read of the mapping (the validation walk, each record's decode) runs
// inside a MappedReadScope and is followed by check_unchanged(), which throws
// CorruptShardError "changed while being read" (platform/file_mapping.h). A
// file rewritten in place at the same size is caught record by record by the
// v3 binding fingerprint and the checksums (record_decoder.h).
//
// Before mapping, the file must be a regular file (opened without blocking,
// so a FIFO never waits) and not empty (platform/file_mapping.h).
//
// A ShardSet is eager (every shard opened by the constructor) or lazy (a
// dataset still being downloaded: the record counts are known, each shard is
// opened later by attach(), once its file is whole). Reading a record of a
// shard not attached yet is a FastloadError, never a crash; the Python side
// submits a batch only after attaching every shard it reads.
//
// A lazy set's shard may also be detached again (a bounded cache evicting it):
// pin() keeps shards attached while batches that read them are in flight (the
// BatchReader pins a batch's shards when it is submitted and unpins them when
// it is delivered or dropped), and detach() closes a shard only when no pin
// holds it. So a shard is never unmapped under a read.
//
// Thread safety: a ShardFile is immutable after construction. A ShardSet may
// be shared by any number of threads; attach(), detach(), pin() and unpin()
// may run on any thread while others read: attach publishes a shard
// (release/acquire); pin, detach and attach exclude each other by a mutex.
// Errors: ShardNotFoundError, CorruptShardError (construction, attach),
// CorruptRecordError (a key past the shard's count).
#pragma once

#include <cstddef>
#include <cstdint>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "format/lmdb_validator.h"
#include "platform/file_mapping.h"

namespace fastload {

class ShardFile {
 public:
  // `packed`: a format v4 shard, whose LMDB entries are blocks of records (format/record_blocks.h).
  ShardFile(std::string path, uint64_t expected_records, bool packed);
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  const std::string& path() const noexcept { return path_; }
  uint64_t records() const noexcept { return spans_.size(); }
  const ShardLayout& layout() const noexcept { return layout_; }
  const FileMapping& mapping() const noexcept { return *mapping_; }

  // Throws CorruptShardError when the file shrank under a read of it (see above).
  void check_unchanged() const { mapping_->check_unchanged(path_); }
  // After a decode error: also a file no longer of the mapped size counts as changed.
  void check_unchanged_after_error() const { mapping_->check_unchanged_after_error(path_); }

  // The bytes of record `key` (the index within the shard), valid while the
  // ShardFile lives: call it inside a MappedReadScope of mapping() (it reads the
  // header of the record's overflow run, which the validation left to the read:
  // lmdb_validator.h) and check_unchanged() after the bytes are read. Throws
  // CorruptRecordError when the key is out of range or the run's header is wrong.
  std::pair<const uint8_t*, size_t> record(uint64_t key) const {
    if (key >= spans_.size()) throw_missing(key);
    const RecordSpan& s = spans_[key];
    if (!run_header_ok(map_, s, layout_.page_size)) throw_bad_run(key);
    return {map_ + s.offset, s.size};
  }

  // Where record `key` lies, without reading the file (for prefetch hints and
  // sizes): not for reading its bytes, record() is. Throws as record().
  std::pair<const uint8_t*, size_t> record_location(uint64_t key) const {
    if (key >= spans_.size()) throw_missing(key);
    return {map_ + spans_[key].offset, spans_[key].size};
  }

 private:
  [[noreturn]] void throw_missing(uint64_t key) const;
  [[noreturn]] void throw_bad_run(uint64_t key) const;

  std::string path_;
  std::unique_ptr<FileMapping> mapping_;
  const uint8_t* map_ = nullptr;  // mapping_->data()
  ShardLayout layout_;
  std::vector<RecordSpan> spans_;
};

class ShardSet {
 public:
  // Eager: opens and validates every shard now, several at once (up to 8
  // threads, no more than the CPUs, all joined before it returns or throws);
  // throws the error of the lowest shard that fails, as opening them in order.
  // packed[i]: shard i is a format v4 shard (blocks of records).
  ShardSet(const std::vector<std::string>& paths, const std::vector<uint64_t>& counts, const std::vector<bool>& packed);
  // Lazy: shards of these record counts, none opened; attach() opens each.
  ShardSet(const std::vector<uint64_t>& counts, const std::vector<bool>& packed);

  size_t size() const noexcept { return files_.size(); }
  uint64_t total_records() const noexcept { return offsets_.back(); }
  // Throws FastloadError when shard i is out of range or not attached yet.
  const ShardFile& shard(size_t i) const;

  // Opens and validates `path` as shard i (outside any lock) and publishes it;
  // a second attach of the same shard keeps the first. Throws as ShardFile's
  // constructor, and FastloadError for an index out of range.
  void attach(size_t i, const std::string& path);
  bool attached(size_t i) const noexcept {
    return i < files_.size() && files_[i].load(std::memory_order_acquire) != nullptr;
  }
  bool lazy() const noexcept { return lazy_; }

  // Lazy sets: pins every shard of `shards` (an index may repeat) when all are
  // attached and returns true; else pins nothing and returns false.
  bool pin(const std::vector<size_t>& shards) const;
  // Releases one pin() of the same shards.
  void unpin(const std::vector<size_t>& shards) const noexcept;
  // Lazy sets: closes shard i (unmaps its file) and returns true when no pin
  // holds it (also when it was not attached); false when pinned. Throws
  // FastloadError for an index out of range or an eager set.
  bool detach(size_t i);

  // Maps a global sample index to (shard, key within shard). Throws
  // FastloadError when the index is out of range.
  std::pair<size_t, uint64_t> locate(uint64_t global_index) const;

  // Hints the CPU to start loading the first bytes of a record that will be
  // read soon (random reads are memory-latency bound); no effect on results.
  // Indices out of range, and records of shards not attached, are ignored.
  void prefetch(uint64_t global_index) const noexcept;

 private:
  void set_counts(const std::vector<uint64_t>& counts);
  void open_all(const std::vector<std::string>& paths, const std::vector<uint64_t>& counts);  // into owned_

  std::vector<std::atomic<const ShardFile*>> files_;  // null until attached; owned by owned_
  std::vector<std::unique_ptr<ShardFile>> owned_;     // written under attach_mutex_ only (once built)
  mutable std::vector<uint32_t> pins_;                // per shard; guarded by attach_mutex_
  mutable std::mutex attach_mutex_;
  bool lazy_ = false;
  std::vector<uint64_t> offsets_;  // offsets_[i] = first global index of shard i
  std::vector<bool> packed_;       // per shard: format v4 (blocks of records)
};

// Maps `path` and validates it as a shard of `expected_records` records;
// returns the layout (used by `fastload verify` and ShardDataset before they
// let py-lmdb open the file). Throws as ShardFile's constructor.
ShardLayout validate_shard_file(const std::string& path, uint64_t expected_records, bool packed = false);

}  // namespace fastload
