#include "shard_reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "checked_math.h"
#include "errors.h"

namespace fastload {
namespace {

// An open file descriptor, closed on scope exit.
class Fd {
 public:
  explicit Fd(int fd) noexcept : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const noexcept { return fd_; }

 private:
  int fd_;
};

// A read-only shared mapping of a whole file; unmapped unless released.
class Mapping {
 public:
  Mapping(const std::string& path, const uint8_t** data, size_t* bytes) {
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
    if (fd.get() < 0) {
      if (errno == ENOENT) throw ShardNotFoundError(path);
      throw CorruptShardError(path, std::string("cannot open the file (") + std::strerror(errno) + ")");
    }
    struct stat st {};
    if (::fstat(fd.get(), &st) != 0) throw CorruptShardError(path, "cannot stat the file");
    if (!S_ISREG(st.st_mode)) throw CorruptShardError(path, "not a regular file");
    if (st.st_size == 0) throw CorruptShardError(path, "the file is empty (0 bytes)");
    if (static_cast<uint64_t>(st.st_size) < kMinShardBytes) {
      throw CorruptShardError(path, std::to_string(st.st_size) + " bytes, too short for an LMDB file");
    }
    bytes_ = static_cast<size_t>(st.st_size);
    void* p = ::mmap(nullptr, bytes_, PROT_READ, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) throw CorruptShardError(path, std::string("cannot map the file (") + std::strerror(errno) + ")");
    data_ = static_cast<const uint8_t*>(p);
    *data = data_;
    *bytes = bytes_;
  }
  ~Mapping() {
    if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), bytes_);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void release() noexcept { data_ = nullptr; }

 private:
  const uint8_t* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace

ShardFile::ShardFile(std::string path, uint64_t expected_records) : path_(std::move(path)) {
  Mapping mapping(path_, &map_, &map_bytes_);
  layout_ = validate_lmdb(map_, map_bytes_, expected_records, path_);
  spans_ = std::move(layout_.records);
  layout_.records.clear();
  mapping.release();  // owned by this ShardFile from here on
}

ShardFile::~ShardFile() { ::munmap(const_cast<uint8_t*>(map_), map_bytes_); }

void ShardFile::throw_missing(uint64_t key) const {
  throw CorruptRecordError(path_, key, "key not found in the shard (it holds " + std::to_string(spans_.size()) +
                                           " records)");
}

ShardLayout validate_shard_file(const std::string& path, uint64_t expected_records) {
  const uint8_t* data = nullptr;
  size_t bytes = 0;
  Mapping mapping(path, &data, &bytes);
  ShardLayout layout = validate_lmdb(data, bytes, expected_records, path);
  layout.records.clear();
  layout.records.shrink_to_fit();
  return layout;
}

ShardSet::ShardSet(const std::vector<std::string>& paths, const std::vector<uint64_t>& counts) {
  if (paths.size() != counts.size()) throw FastloadError("ShardSet: paths and counts differ in length");
  offsets_.reserve(paths.size() + 1);
  offsets_.push_back(0);
  for (size_t i = 0; i < paths.size(); ++i) {
    shards_.push_back(std::make_unique<ShardFile>(paths[i], counts[i]));
    uint64_t next = 0;
    if (!checked_add(offsets_.back(), counts[i], &next)) throw FastloadError("ShardSet: record counts overflow");
    offsets_.push_back(next);
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
