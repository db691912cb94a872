#include "shard_reader.h"

#include <lmdb.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "errors.h"

namespace fastload {
namespace {

std::string lmdb_text(int rc) { return std::string(mdb_strerror(rc)); }

void store_key(uint64_t key, unsigned char out[8]) noexcept {
  for (int i = 7; i >= 0; --i) {
    out[i] = static_cast<unsigned char>(key & 0xFF);
    key >>= 8;
  }
}

}  // namespace

ShardEnv::ShardEnv(std::string path, uint64_t expected_records) : path_(std::move(path)), records_(expected_records) {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0) {
    if (errno == ENOENT) throw ShardNotFoundError(path_);
    throw CorruptShardError(path_, "cannot stat the file");
  }
  int rc = mdb_env_create(&env_);
  if (rc != 0) throw CorruptShardError(path_, "mdb_env_create: " + lmdb_text(rc));
  try {
    const size_t file_size = static_cast<size_t>(st.st_size);
    rc = mdb_env_set_mapsize(env_, std::max<size_t>(file_size, 1));
    if (rc == 0) rc = mdb_env_open(env_, path_.c_str(), MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOTLS, 0444);
    if (rc != 0) throw CorruptShardError(path_, "not a readable LMDB file (" + lmdb_text(rc) + ")");
    MDB_envinfo info{};
    MDB_stat stat{};
    mdb_env_info(env_, &info);
    rc = mdb_env_stat(env_, &stat);
    if (rc != 0) throw CorruptShardError(path_, "mdb_env_stat: " + lmdb_text(rc));
    const size_t needed = (static_cast<size_t>(info.me_last_pgno) + 1) * stat.ms_psize;
    if (file_size < needed) {
      throw CorruptShardError(path_, "truncated: the file has " + std::to_string(file_size) +
                                         " bytes, its LMDB pages need " + std::to_string(needed));
    }
    if (stat.ms_entries != expected_records) {
      throw CorruptShardError(path_, "holds " + std::to_string(stat.ms_entries) + " records, the manifest says " +
                                         std::to_string(expected_records));
    }
  } catch (...) {
    mdb_env_close(env_);
    throw;
  }
}

ShardEnv::~ShardEnv() { mdb_env_close(env_); }

ShardTxn::ShardTxn(const ShardEnv& shard) : shard_(shard) {
  int rc = mdb_txn_begin(shard_.env(), nullptr, MDB_RDONLY, &txn_);
  if (rc != 0) throw CorruptShardError(shard_.path(), "mdb_txn_begin: " + lmdb_text(rc));
  MDB_dbi dbi = 0;
  rc = mdb_dbi_open(txn_, nullptr, 0, &dbi);
  if (rc != 0) {
    mdb_txn_abort(txn_);
    throw CorruptShardError(shard_.path(), "mdb_dbi_open: " + lmdb_text(rc));
  }
  dbi_ = dbi;
}

ShardTxn::~ShardTxn() { mdb_txn_abort(txn_); }

std::pair<const uint8_t*, size_t> ShardTxn::get(uint64_t key) const {
  unsigned char key_bytes[8];
  store_key(key, key_bytes);
  MDB_val k{sizeof(key_bytes), key_bytes};
  MDB_val v{0, nullptr};
  const int rc = mdb_get(txn_, dbi_, &k, &v);
  if (rc == MDB_NOTFOUND) throw CorruptRecordError(shard_.path(), key, "key not found in the shard");
  if (rc != 0) throw CorruptRecordError(shard_.path(), key, "mdb_get: " + lmdb_text(rc));
  return {static_cast<const uint8_t*>(v.mv_data), v.mv_size};
}

ShardSet::ShardSet(const std::vector<std::string>& paths, const std::vector<uint64_t>& counts) {
  if (paths.size() != counts.size()) throw FastloadError("ShardSet: paths and counts differ in length");
  offsets_.reserve(paths.size() + 1);
  offsets_.push_back(0);
  for (size_t i = 0; i < paths.size(); ++i) {
    shards_.push_back(std::make_unique<ShardEnv>(paths[i], counts[i]));
    offsets_.push_back(offsets_.back() + counts[i]);
  }
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

}  // namespace fastload
