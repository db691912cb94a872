// FileMapping: a whole file mapped read-only, for the shard reader.
//
// The file must be a regular, non-empty file; it is opened without blocking
// (O_NONBLOCK on POSIX), so a FIFO in place of a shard is refused instead of
// waiting for a writer. The mapping lives as long as the object.
//
// POSIX: open + fstat + mmap(PROT_READ, MAP_SHARED). Windows: CreateFileW +
// GetFileType + CreateFileMappingW + MapViewOfFile (written to the same
// contract but not yet run on Windows, like the rest of the Windows paths).
//
// Thread safety: immutable after construction. Errors: ShardNotFoundError,
// CorruptShardError (not a regular file, empty, cannot be mapped).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace fastload {

class FileMapping {
 public:
  explicit FileMapping(const std::string& path);
  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  const uint8_t* data() const noexcept { return data_; }
  uint64_t size() const noexcept { return size_; }

 private:
  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace fastload
