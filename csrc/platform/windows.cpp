// The Windows side of the platform layer (platform.h, file_mapping.h).
#ifndef NOMINMAX
#define NOMINMAX
#endif
#ifndef WIN32_LEAN_AND_MEAN
#define WIN32_LEAN_AND_MEAN
#endif
#include <windows.h>

#include <climits>
#include <cstdint>
#include <string>

#include "errors.h"
#include "platform/file_mapping.h"
#include "platform/platform.h"

namespace fastload {
namespace {

// A Windows handle, closed on scope exit.
struct Handle {
  HANDLE h;
  ~Handle() {
    if (h != nullptr && h != INVALID_HANDLE_VALUE) CloseHandle(h);
  }
};

[[noreturn]] void throw_open_error(const std::string& path, DWORD err) {
  switch (err) {
    case ERROR_FILE_NOT_FOUND:
    case ERROR_PATH_NOT_FOUND:
      throw ShardNotFoundError(path);
    case ERROR_SHARING_VIOLATION:
      throw CorruptShardError(path, "cannot open the file: another process holds it open for writing "
                                    "(sharing violation); shards are read only once written");
    case ERROR_ACCESS_DENIED:
      throw CorruptShardError(path, "cannot open the file: access denied (a directory, or no read permission)");
    default:
      throw CorruptShardError(path, "cannot open the file (Windows error " + std::to_string(err) + ")");
  }
}

}  // namespace

std::wstring utf8_to_wide(const std::string& utf8) {
  if (utf8.empty()) return std::wstring();
  if (utf8.size() > static_cast<size_t>(INT_MAX)) throw FastloadError("path too long: " + utf8.substr(0, 200));
  const int in = static_cast<int>(utf8.size());
  const int n = MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, utf8.data(), in, nullptr, 0);
  if (n <= 0) throw FastloadError("path is not valid UTF-8: " + utf8);
  std::wstring out(static_cast<size_t>(n), L'\0');
  if (MultiByteToWideChar(CP_UTF8, MB_ERR_INVALID_CHARS, utf8.data(), in, out.data(), n) != n) {
    throw FastloadError("path is not valid UTF-8: " + utf8);
  }
  return out;
}

FileMapping::FileMapping(const std::string& path) {
  // GENERIC_READ only and PAGE_READONLY below: the file can neither grow nor
  // change through this mapping, and a read-only file attribute is no obstacle.
  Handle file{CreateFileW(utf8_to_wide(path).c_str(), GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_DELETE, nullptr,
                          OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr)};
  if (file.h == INVALID_HANDLE_VALUE) throw_open_error(path, GetLastError());
  if (GetFileType(file.h) != FILE_TYPE_DISK) throw CorruptShardError(path, "not a regular file");
  LARGE_INTEGER size{};
  if (!GetFileSizeEx(file.h, &size)) throw CorruptShardError(path, "cannot read the file's size");
  if (size.QuadPart == 0) throw CorruptShardError(path, "the file is empty (0 bytes)");
  if (static_cast<unsigned long long>(size.QuadPart) > static_cast<unsigned long long>(SIZE_MAX)) {
    throw CorruptShardError(path, "the file is too large to map");
  }
  Handle mapping{CreateFileMappingW(file.h, nullptr, PAGE_READONLY, 0, 0, nullptr)};
  if (mapping.h == nullptr) {
    throw CorruptShardError(path, "cannot map the file (Windows error " + std::to_string(GetLastError()) + ")");
  }
  void* view = MapViewOfFile(mapping.h, FILE_MAP_READ, 0, 0, 0);
  if (view == nullptr) {
    throw CorruptShardError(path, "cannot map the file (Windows error " + std::to_string(GetLastError()) + ")");
  }
  // The view keeps the file and the mapping object alive; both handles close here.
  data_ = static_cast<const uint8_t*>(view);
  size_ = static_cast<uint64_t>(size.QuadPart);
}

FileMapping::~FileMapping() { UnmapViewOfFile(data_); }

// Windows refuses to shrink a file while a view of it is mapped: nothing to guard.
MappedReadScope::MappedReadScope(const FileMapping& mapping) noexcept
    : range_{mapping.data_, mapping.size_, &mapping.changed_}, outer_(nullptr) {}
MappedReadScope::~MappedReadScope() = default;
bool FileMapping::same_size_on_disk(const std::string&) const noexcept { return true; }

size_t physical_memory_bytes() noexcept {
  MEMORYSTATUSEX status{};
  status.dwLength = sizeof(status);
  if (!GlobalMemoryStatusEx(&status) || status.ullTotalPhys > SIZE_MAX) return SIZE_MAX;
  return static_cast<size_t>(status.ullTotalPhys);
}

std::optional<uint64_t> thread_disk_faults() noexcept {
  return std::nullopt;  // Windows counts page faults per process, soft ones included
}

void advise_huge_pages(void* data, size_t size) noexcept {
  // Large pages on Windows need a privilege and an allocation of their own (VirtualAlloc with
  // MEM_LARGE_PAGES): buffers handed in by Python stay as they are.
  static_cast<void>(data);
  static_cast<void>(size);
}

bool prefault_for_writing(void* data, size_t size) noexcept {
  // Nothing here: Windows has no call that faults pages in without writing them (PrefetchVirtualMemory reads).
  static_cast<void>(data);
  static_cast<void>(size);
  return false;
}

bool map_cached_pages(const void* data, size_t size, size_t* mapped) noexcept {
  // Nothing here: Windows says which pages are resident only per working set, and PrefetchVirtualMemory reads.
  static_cast<void>(data);
  static_cast<void>(size);
  static_cast<void>(mapped);
  return false;
}

void name_this_thread(const std::string& name) noexcept {
  // SetThreadDescription exists from Windows 10 1607: looked up, not linked.
  using SetDescription = HRESULT(WINAPI*)(HANDLE, PCWSTR);
  HMODULE kernel = GetModuleHandleW(L"kernel32.dll");
  if (kernel == nullptr) return;
  auto fn = reinterpret_cast<SetDescription>(reinterpret_cast<void*>(GetProcAddress(kernel, "SetThreadDescription")));
  if (fn == nullptr) return;
  try {
    fn(GetCurrentThread(), utf8_to_wide(name).c_str());
  } catch (...) {
  }
}

}  // namespace fastload
