#include "file_mapping.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "errors.h"

#ifdef _WIN32
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>
#else
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#endif

namespace fastload {

#ifdef _WIN32

namespace {

std::wstring widen(const std::string& utf8) {
  const int n = MultiByteToWideChar(CP_UTF8, 0, utf8.data(), static_cast<int>(utf8.size()), nullptr, 0);
  std::wstring out(static_cast<size_t>(n), L'\0');
  MultiByteToWideChar(CP_UTF8, 0, utf8.data(), static_cast<int>(utf8.size()), out.data(), n);
  return out;
}

// A Windows handle, closed on scope exit.
struct Handle {
  HANDLE h;
  ~Handle() {
    if (h != nullptr && h != INVALID_HANDLE_VALUE) CloseHandle(h);
  }
};

}  // namespace

FileMapping::FileMapping(const std::string& path) {
  Handle file{CreateFileW(widen(path).c_str(), GENERIC_READ, FILE_SHARE_READ | FILE_SHARE_DELETE, nullptr,
                          OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr)};
  if (file.h == INVALID_HANDLE_VALUE) {
    const DWORD err = GetLastError();
    if (err == ERROR_FILE_NOT_FOUND || err == ERROR_PATH_NOT_FOUND) throw ShardNotFoundError(path);
    throw CorruptShardError(path, "cannot open the file (error " + std::to_string(err) + ")");
  }
  if (GetFileType(file.h) != FILE_TYPE_DISK) throw CorruptShardError(path, "not a regular file");
  LARGE_INTEGER size{};
  if (!GetFileSizeEx(file.h, &size)) throw CorruptShardError(path, "cannot read the file's size");
  if (size.QuadPart == 0) throw CorruptShardError(path, "the file is empty (0 bytes)");
  Handle mapping{CreateFileMappingW(file.h, nullptr, PAGE_READONLY, 0, 0, nullptr)};
  if (mapping.h == nullptr) throw CorruptShardError(path, "cannot map the file");
  void* view = MapViewOfFile(mapping.h, FILE_MAP_READ, 0, 0, 0);
  if (view == nullptr) throw CorruptShardError(path, "cannot map the file");
  data_ = static_cast<const uint8_t*>(view);
  size_ = static_cast<uint64_t>(size.QuadPart);
}

FileMapping::~FileMapping() { UnmapViewOfFile(data_); }

#else

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

#endif

}  // namespace fastload
