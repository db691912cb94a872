// Error taxonomy of the core. Mirrors python/fastload/errors.py; bindings/errors.cpp
// translates each class to its Python twin in one place.
//
// Every message names the operation, the file and the record where there is
// one, e.g. "decode: train/shard-00003.lmdb record 1234: zstd frame truncated".
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace fastload {

// Base of everything the core throws on bad data or bad arguments.
class FastloadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A record failed to decode. Thrown by RecordDecoder without a location
// (path empty); the caller that knows the shard rethrows it with one.
class CorruptRecordError : public FastloadError {
 public:
  CorruptRecordError(std::string path, uint64_t record, std::string reason)
      : FastloadError("decode: " + path + " record " + std::to_string(record) + ": " + reason),
        path_(std::move(path)),
        record_(record),
        reason_(std::move(reason)) {}
  const std::string& path() const noexcept { return path_; }
  uint64_t record() const noexcept { return record_; }
  const std::string& reason() const noexcept { return reason_; }

 private:
  std::string path_;
  uint64_t record_;
  std::string reason_;
};

// A shard file could not be opened as a whole: missing, truncated, not LMDB,
// or holding a different number of records than the manifest says.
class CorruptShardError : public FastloadError {
 public:
  CorruptShardError(std::string path, const std::string& reason)
      : FastloadError("open: " + path + ": " + reason), path_(std::move(path)) {}
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

class ShardNotFoundError : public FastloadError {
 public:
  explicit ShardNotFoundError(std::string path)
      : FastloadError("open: " + path + ": shard file not found"), path_(std::move(path)) {}
  const std::string& path() const noexcept { return path_; }

 private:
  std::string path_;
};

// Thrown by the record decoder, which does not know where its bytes came from.
class DecodeError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

}  // namespace fastload
