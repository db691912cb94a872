// ShardSet and ShardTxn: read-only access to the LMDB shards of one dataset.
//
// A ShardSet opens every shard once (single-file environments, MDB_RDONLY |
// MDB_NOLOCK, so nothing is written next to the data) and checks, before any
// page is touched, that the file is as long as LMDB's meta page says and that
// it holds the record count the manifest promised. A truncated file would
// otherwise fault (SIGBUS) on first access through the memory map.
//
// Thread safety: a ShardSet is immutable after construction and may be shared.
// A ShardTxn is one read transaction on one shard and belongs to one thread.
// Errors: ShardNotFoundError, CorruptShardError (open), CorruptRecordError
// (a key that is missing).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

struct MDB_env;
struct MDB_txn;

namespace fastload {

class ShardEnv {
 public:
  ShardEnv(std::string path, uint64_t expected_records);
  ~ShardEnv();
  ShardEnv(const ShardEnv&) = delete;
  ShardEnv& operator=(const ShardEnv&) = delete;

  MDB_env* env() const noexcept { return env_; }
  const std::string& path() const noexcept { return path_; }
  uint64_t records() const noexcept { return records_; }

 private:
  std::string path_;
  uint64_t records_;
  MDB_env* env_ = nullptr;
};

// One read transaction plus the database handle, for one thread.
class ShardTxn {
 public:
  explicit ShardTxn(const ShardEnv& shard);
  ~ShardTxn();
  ShardTxn(const ShardTxn&) = delete;
  ShardTxn& operator=(const ShardTxn&) = delete;

  // The bytes of record `key` (the index within the shard), valid while the
  // transaction lives. Throws CorruptRecordError when the key is missing.
  std::pair<const uint8_t*, size_t> get(uint64_t key) const;

 private:
  const ShardEnv& shard_;
  MDB_txn* txn_ = nullptr;
  unsigned int dbi_ = 0;
};

class ShardSet {
 public:
  ShardSet(const std::vector<std::string>& paths, const std::vector<uint64_t>& counts);

  size_t size() const noexcept { return shards_.size(); }
  uint64_t total_records() const noexcept { return offsets_.back(); }
  const ShardEnv& shard(size_t i) const { return *shards_.at(i); }

  // Maps a global sample index to (shard, key within shard). Throws
  // FastloadError when the index is out of range.
  std::pair<size_t, uint64_t> locate(uint64_t global_index) const;

 private:
  std::vector<std::unique_ptr<ShardEnv>> shards_;
  std::vector<uint64_t> offsets_;  // offsets_[i] = first global index of shard i
};

}  // namespace fastload
