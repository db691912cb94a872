// The POSIX side of the platform layer (platform.h, file_mapping.h).
#include <fcntl.h>
#include <pthread.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>

#include "errors.h"
#include "platform/file_mapping.h"
#include "platform/platform.h"

namespace fastload {
namespace {

// A file descriptor, closed on scope exit.
struct Fd {
  int fd;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

FileMapping::FileMapping(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer.
  Fd fd{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC)};
  if (fd.fd < 0) {
    if (errno == ENOENT) throw ShardNotFoundError(path);
    throw CorruptShardError(path, std::string("cannot open the file (") + std::strerror(errno) + ")");
  }
  struct stat st {};
  if (::fstat(fd.fd, &st) != 0) throw CorruptShardError(path, "cannot stat the file");
  if (!S_ISREG(st.st_mode)) throw CorruptShardError(path, "not a regular file");
  if (st.st_size == 0) throw CorruptShardError(path, "the file is empty (0 bytes)");
  const auto bytes = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd.fd, 0);
  if (p == MAP_FAILED) throw CorruptShardError(path, std::string("cannot map the file (") + std::strerror(errno) + ")");
  data_ = static_cast<const uint8_t*>(p);
  size_ = bytes;
}

FileMapping::~FileMapping() { ::munmap(const_cast<uint8_t*>(data_), static_cast<size_t>(size_)); }

size_t physical_memory_bytes() noexcept {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return SIZE_MAX;
  size_t total = 0;
  if (__builtin_mul_overflow(static_cast<size_t>(pages), static_cast<size_t>(page), &total)) return SIZE_MAX;
  return total;
}

void name_this_thread(const std::string& name) noexcept {
#if defined(__APPLE__)
  pthread_setname_np(name.substr(0, 63).c_str());
#elif defined(__linux__)
  pthread_setname_np(pthread_self(), name.substr(0, 15).c_str());
#else
  (void)name;
#endif
}

}  // namespace fastload
