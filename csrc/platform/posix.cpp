// The POSIX side of the platform layer (platform.h, file_mapping.h).
//
// The SIGBUS handler (file_mapping.h) is the one piece of process-wide state
// in the core, as a signal disposition is process-wide by nature: the handler
// it replaced (to forward every fault that is not a read of a shrunk mapping
// inside a MappedReadScope) and the page size, both written once, before the
// handler is installed. Which mapping a thread is reading is thread-local.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <mutex>
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

// The mapping the calling thread reads now (innermost MappedReadScope), or null.
thread_local const MappedReadScope::Range* t_reading = nullptr;

struct BusErrorState {
  struct sigaction previous {};
  uintptr_t page_size = 4096;
};

BusErrorState& bus_error_state() {
  static BusErrorState state;
  return state;
}

// Hands a SIGBUS that is not ours to the handler we replaced, or to the default action.
void forward_bus_error(int sig, siginfo_t* info, void* context) {
  const struct sigaction& prev = bus_error_state().previous;
  const bool sent = info == nullptr || info->si_code <= 0;  // by kill/raise, not by a faulting access
  if ((prev.sa_flags & SA_SIGINFO) != 0) {
    if (prev.sa_sigaction != nullptr) {
      prev.sa_sigaction(sig, info, context);
      return;
    }
  } else if (prev.sa_handler == SIG_IGN) {
    if (sent) return;  // a fault cannot be ignored: it would recur forever; take the default below
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != nullptr) {
    prev.sa_handler(sig);
    return;
  }
  // The default action: a faulting access runs again on return and ends the process as it would have.
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  if (sent) ::raise(sig);
}

extern "C" void on_bus_error(int sig, siginfo_t* info, void* context) {
  const int saved_errno = errno;
  const MappedReadScope::Range* range = t_reading;
  if (range != nullptr && info != nullptr && info->si_code > 0) {
    const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
    const auto begin = reinterpret_cast<uintptr_t>(range->data);
    if (addr >= begin && addr - begin < range->size) {
      // The flag first: a thread that reads the page of zeros below finds it set when it checks.
      range->changed->store(true, std::memory_order_seq_cst);
      const uintptr_t page = bus_error_state().page_size;
      void* at = reinterpret_cast<void*>(addr & ~(page - 1));
      if (::mmap(at, page, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != MAP_FAILED) {
        errno = saved_errno;
        return;  // the read goes on, over zeros, and its result is refused by check_unchanged
      }
    }
  }
  errno = saved_errno;
  forward_bus_error(sig, info, context);
}

// Installs on_bus_error once per process, remembering the handler it replaces.
void install_bus_error_handler() {
  static std::once_flag once;
  std::call_once(once, [] {
    BusErrorState& state = bus_error_state();
    const long page = sysconf(_SC_PAGESIZE);
    if (page > 0) state.page_size = static_cast<uintptr_t>(page);
    if (::sigaction(SIGBUS, nullptr, &state.previous) != 0) return;
    struct sigaction ours {};
    ours.sa_sigaction = &on_bus_error;
    sigemptyset(&ours.sa_mask);
    ours.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK | SA_RESTART;
    ::sigaction(SIGBUS, &ours, nullptr);
  });
}

}  // namespace

MappedReadScope::MappedReadScope(const FileMapping& mapping) noexcept
    : range_{mapping.data_, mapping.size_, &mapping.changed_}, outer_(t_reading) {
  t_reading = &range_;
  std::atomic_signal_fence(std::memory_order_seq_cst);  // in force before this thread's next read
}

MappedReadScope::~MappedReadScope() {
  std::atomic_signal_fence(std::memory_order_seq_cst);  // the reads inside come before
  t_reading = outer_;
}

FileMapping::FileMapping(const std::string& path) {
  install_bus_error_handler();
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

bool FileMapping::same_size_on_disk(const std::string& path) const noexcept {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_size) == size_;
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

std::optional<uint64_t> thread_disk_faults() noexcept {
#if defined(__linux__) && defined(RUSAGE_THREAD)
  struct rusage usage {};
  if (::getrusage(RUSAGE_THREAD, &usage) != 0 || usage.ru_majflt < 0) return std::nullopt;
  return static_cast<uint64_t>(usage.ru_majflt);
#else
  return std::nullopt;  // macOS and the BSDs count them per process only
#endif
}

void advise_huge_pages(void* data, size_t size) noexcept {
#ifdef MADV_HUGEPAGE
  static_cast<void>(::madvise(data, size, MADV_HUGEPAGE));  // refused (no THP, not aligned): nothing changes
#else
  static_cast<void>(data);
  static_cast<void>(size);
#endif
}

#if defined(__linux__)
namespace {

struct WholePages {
  uintptr_t first;  // the first whole page's address
  uintptr_t last;   // the end of the last whole page (<= first: there is none)
  uintptr_t page;   // the page size
};

// The whole pages inside [data, data + size).
WholePages whole_pages(const void* data, size_t size) noexcept {
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  if (page == 0 || size < page) return {0, 0, page};
  const auto begin = reinterpret_cast<uintptr_t>(data);
  // No overflow: [data, data + size) is memory.
  return {(begin + page - 1) / page * page, (begin + size) / page * page, page};
}

}  // namespace
#endif

bool prefault_for_writing(void* data, size_t size) noexcept {
#if defined(__linux__)
#ifdef MADV_POPULATE_WRITE
  constexpr int kPopulateWrite = MADV_POPULATE_WRITE;
#else
  constexpr int kPopulateWrite = 23;  // MADV_POPULATE_WRITE (Linux 5.14), absent from older headers
#endif
  const auto [first, last, page] = whole_pages(data, size);
  if (last <= first) return true;
  // EINVAL: a kernel without it (or a sandbox such as gVisor). Anything else (ENOMEM, EINTR) is ignored.
  return ::madvise(reinterpret_cast<void*>(first), last - first, kPopulateWrite) == 0 || errno != EINVAL;
#else
  static_cast<void>(data);
  static_cast<void>(size);
  return false;
#endif
}

bool map_cached_pages(const void* data, size_t size, size_t* mapped) noexcept {
#if defined(__linux__)
#ifdef MADV_POPULATE_READ
  constexpr int kPopulateRead = MADV_POPULATE_READ;
#else
  constexpr int kPopulateRead = 22;  // MADV_POPULATE_READ (Linux 5.14), absent from older headers
#endif
  const auto [first, last, page] = whole_pages(data, size);
  unsigned char cached[512];  // mincore's answer, a byte per page (bit 0: cached), 512 pages a call
  for (uintptr_t at = first; at < last;) {
    const uintptr_t pages = std::min<uintptr_t>((last - at) / page, sizeof(cached));
    if (::mincore(reinterpret_cast<void*>(at), pages * page, cached) != 0) return errno != ENOSYS;
    for (uintptr_t i = 0; i < pages;) {
      if ((cached[i] & 1) == 0) {
        ++i;
        continue;
      }
      uintptr_t j = i;
      while (j < pages && (cached[j] & 1) != 0) ++j;
      const uintptr_t run = (j - i) * page;
      if (::madvise(reinterpret_cast<void*>(at + i * page), run, kPopulateRead) == 0) {
        *mapped += run;
      } else if (errno == EINVAL) {
        return false;  // a kernel without it (or a sandbox such as gVisor)
      }
      i = j;
    }
    at += pages * page;
  }
  return true;
#else
  static_cast<void>(data);
  static_cast<void>(size);
  static_cast<void>(mapped);
  return false;
#endif
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
