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
// A file that shrinks while it is mapped (truncated, or rewritten shorter by
// another job, a sync tool or a cache eviction) makes a read of a page past its
// new end raise SIGBUS on POSIX. Reads of a mapping therefore happen inside a
// MappedReadScope: the process's SIGBUS handler (installed by the first
// FileMapping, chaining to the handler it replaces for every other fault)
// sees that the faulting address lies in the mapping this thread is reading,
// marks the mapping changed, puts a page of zeros where the vanished page was,
// and lets the read go on. The reader then calls check_unchanged(), which
// throws CorruptShardError ("changed while being read") for that read and every
// later one: no byte read from such a mapping is ever delivered. Windows
// refuses to shrink a mapped file, so there the scope does nothing.
//
// Thread safety: immutable after construction except the changed flag
// (atomic). Errors: ShardNotFoundError, CorruptShardError (not a regular file,
// empty, cannot be opened or mapped, changed while being read), FastloadError
// (a path that is not valid UTF-8, Windows).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "errors.h"

namespace fastload {

class FileMapping {
 public:
  explicit FileMapping(const std::string& path);
  ~FileMapping();
  FileMapping(const FileMapping&) = delete;
  FileMapping& operator=(const FileMapping&) = delete;

  const uint8_t* data() const noexcept { return data_; }
  uint64_t size() const noexcept { return size_; }

  // True once a read of this mapping met a page the file no longer has.
  bool changed() const noexcept { return changed_.load(std::memory_order_acquire); }

  // Throws CorruptShardError naming `path` when changed(). Call it after the
  // bytes read inside a MappedReadScope were used and before they are handed
  // on. The fence orders those reads before the flag's load, so a page of
  // zeros put in by another thread's fault is never taken for data.
  void check_unchanged(const std::string& path) const {
    std::atomic_thread_fence(std::memory_order_acquire);
    if (changed()) throw_changed(path);
  }

  // As check_unchanged, after a read found damage: the file at `path` no
  // longer having the mapped size also counts as changed (the bytes past a
  // new end inside its last page read as zeros without any fault).
  void check_unchanged_after_error(const std::string& path) const {
    if (!changed() && !same_size_on_disk(path)) changed_.store(true, std::memory_order_release);
    check_unchanged(path);
  }

 private:
  friend class MappedReadScope;
  bool same_size_on_disk(const std::string& path) const noexcept;
  [[noreturn]] static void throw_changed(const std::string& path) {
    throw CorruptShardError(path, "changed while being read: the file is no longer the one opened (truncated or "
                                  "rewritten by another process); nothing read from it since is used");
  }

  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  mutable std::atomic<bool> changed_{false};
};

// Marks the calling thread as reading `mapping` until the scope ends (see
// above). Scopes nest: the inner one is in force until it ends. Cheap (a few
// thread-local stores); make one per record or per validation pass.
class MappedReadScope {
 public:
  explicit MappedReadScope(const FileMapping& mapping) noexcept;
  ~MappedReadScope();
  MappedReadScope(const MappedReadScope&) = delete;
  MappedReadScope& operator=(const MappedReadScope&) = delete;

  // What the fault handler reads; public for posix.cpp's handler only.
  struct Range {
    const uint8_t* data;
    uint64_t size;
    std::atomic<bool>* changed;
  };

 private:
  Range range_;
  const Range* outer_;
};

}  // namespace fastload
