// FileMapping: a whole file mapped read-only, for the shard reader.
//
// The file must be a regular, non-empty file; it is opened without blocking
// (O_NONBLOCK on POSIX), so a FIFO in place of a shard is refused instead of
// waiting for a writer. The mapping lives as long as the object. Nothing is
// ever written: the file keeps its size and modification time.
//
// POSIX (posix.cpp): open + fstat + mmap(PROT_READ, MAP_SHARED).
// Windows (windows.cpp): the UTF-8 path widened to UTF-16, CreateFileW
// (GENERIC_READ, sharing read and delete, not write: a shard cannot be
// rewritten while mapped) + GetFileType + CreateFileMappingW(PAGE_READONLY) +
// MapViewOfFile. A file another process holds open for writing is refused
// with a message saying so (a sharing violation).
//
// Thread safety: immutable after construction. Errors: ShardNotFoundError,
// CorruptShardError (not a regular file, empty, cannot be opened or mapped),
// FastloadError (a path that is not valid UTF-8, Windows).
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
