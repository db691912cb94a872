// The platform layer: every operating-system call of the core lives under
// csrc/platform/, with one POSIX side (posix.cpp) and one Windows side
// (windows.cpp); CMake compiles the one that fits. The rest of csrc/ is
// portable C++17. What is here:
//   - file_mapping.h: FileMapping, a whole file mapped read-only (open, size
//     and type checks, the mapping);
//   - name_this_thread: names the calling thread for debuggers and profilers;
//   - physical_memory_bytes: the machine's RAM, the bound a batch slot must fit;
//   - thread_disk_faults: the calling thread's page faults that waited for a read from disk;
//   - advise_huge_pages: huge pages for batch buffers, where the system has them;
//   - prefault_for_writing: a fresh buffer's pages faulted in ahead of its first use;
//   - map_cached_pages: page-table entries for the pages of a file mapping that
//     the page cache already holds, without reading any other;
//   - prefetch_for_read: the compiler's cache prefetch hint (GCC/Clang
//     builtin, MSVC intrinsic), or nothing;
//   - utf8_to_wide (Windows only): paths arrive as UTF-8 from Python and are
//     opened with the wide-character API, so non-ASCII names work whatever the
//     process's code page.
// The core has no fork handling and no signal checks: the Python side owns
// both (bindings/reader.cpp checks signals between waits; workers are threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#if !defined(__GNUC__) && !defined(__clang__) && defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
#include <xmmintrin.h>
#endif

namespace fastload {

// Asks the CPU to start loading the cache line at `p` for a read soon. No
// effect on results; a no-op where the compiler offers no hint.
inline void prefetch_for_read(const void* p) noexcept {
#if defined(__GNUC__) || defined(__clang__)
  __builtin_prefetch(p, 0, 0);
#elif defined(_MSC_VER) && (defined(_M_X64) || defined(_M_IX86))
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_NTA);
#else
  (void)p;
#endif
}

// The machine's physical memory in bytes, or SIZE_MAX where the system does
// not say. Never throws.
size_t physical_memory_bytes() noexcept;

// How many of the calling thread's page faults so far had to wait for a read from disk (its major
// faults: a mapped page the page cache did not hold), or nullopt where the system does not count
// them per thread (Linux: getrusage RUSAGE_THREAD; elsewhere nullopt). Never throws.
std::optional<uint64_t> thread_disk_faults() noexcept;

// Asks the system to back the memory [data, data + size) with huge pages
// where it can (Linux: madvise MADV_HUGEPAGE; elsewhere nothing), so that its
// first touch faults in a few large pieces instead of page by page. Only the
// 2 MiB-aligned part can be; the contents are unchanged. Best effort, never
// throws.
void advise_huge_pages(void* data, size_t size) noexcept;

// Faults the whole pages of [data, data + size) in, writable, without
// writing them (Linux 5.14+: madvise MADV_POPULATE_WRITE): a thread with
// nothing else to do takes the first-touch cost of a fresh buffer before the
// workers that fill it get there. The contents are unchanged. Returns false
// where the system has no such call (elsewhere, an older kernel), so that the
// caller stops asking; other refusals are ignored. Never throws.
bool prefault_for_writing(void* data, size_t size) noexcept;

// Maps the pages of the read-only file mapping [data, data + size) that the
// page cache holds already (Linux: mincore, then madvise MADV_POPULATE_READ
// over each run of them, Linux 5.14+), so that reading them later takes no
// page fault; pages not cached are left alone (nothing is read from disk).
// Adds the bytes mapped to *mapped. Returns false where the system has no
// such call (elsewhere, an older kernel), so that the caller stops asking;
// other refusals (a file truncated under the mapping: EFAULT) are ignored.
// Never throws, never faults. Since Linux 5.0 mincore says every page is
// cached for a file the process neither owns nor may write: the caller must
// not use this there, or the whole file is read from disk.
bool map_cached_pages(const void* data, size_t size, size_t* mapped) noexcept;

// Names the calling thread (Linux: at most 15 bytes are kept; Windows 10+:
// SetThreadDescription when the system has it). Best effort, never throws.
void name_this_thread(const std::string& name) noexcept;

#ifdef _WIN32
// Converts UTF-8 to UTF-16. Throws FastloadError naming `utf8` when it is not
// valid UTF-8 (rather than opening some other file).
std::wstring utf8_to_wide(const std::string& utf8);
#endif

}  // namespace fastload
