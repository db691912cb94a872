#include "format/record_blocks.h"

#include <cstring>
#include <string>
#include <vector>

#include "checked_math.h"
#include "errors.h"

namespace fastload {
namespace {

template <typename T>
T load(const uint8_t* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

[[noreturn]] void fail(const std::string& path, uint64_t block, const std::string& reason) {
  throw CorruptShardError(path, "block " + std::to_string(block) + ": " + reason);
}

}  // namespace

std::vector<RecordSpan> unpack_blocks(const uint8_t* data, const std::vector<RecordSpan>& blocks, uint32_t page_size,
                                      uint64_t expected_records, uint16_t version, const std::string& path) {
  std::vector<RecordSpan> records;
  uint64_t key = 0;
  for (uint64_t b = 0; b < blocks.size(); ++b) {
    const RecordSpan& block = blocks[b];
    if (!run_header_ok(data, block, page_size)) fail(path, b, run_header_problem(data, block, page_size));
    if (block.size < kBlockHeaderBytes) {
      fail(path, b, std::to_string(block.size) + " bytes, shorter than a block header (24)");
    }
    const uint8_t* p = data + block.offset;
    if (std::memcmp(p, "FLBK", 4) != 0) fail(path, b, "bad magic, not a block of records");
    const uint16_t own_version = load<uint16_t>(p + 4);
    if (own_version != version) {
      fail(path, b, "block version " + std::to_string(own_version) + " in a version " + std::to_string(version) +
                        " dataset");
    }
    const uint8_t width = p[6];
    if (width != 0 && width != 2 && width != 4) fail(path, b, "index width " + std::to_string(width) + ", expected 0, 2 or 4");
    if (p[7] != 0) fail(path, b, "reserved byte " + std::to_string(p[7]) + ", expected 0");
    const uint64_t first = load<uint64_t>(p + 8);
    if (first != key) {
      fail(path, b, "first key " + std::to_string(first) + ", expected " + std::to_string(key) +
                        " (blocks out of order)");
    }
    const uint32_t count = load<uint32_t>(p + 16), common = load<uint32_t>(p + 20);
    if (count == 0) fail(path, b, "holds no records");
    if ((width == 0) != (common != 0)) {
      fail(path, b, "record length " + std::to_string(common) + " with index width " + std::to_string(width));
    }
    if (width == 0 && common < kMinBlockRecordBytes) {
      fail(path, b, "records of " + std::to_string(common) + " bytes, shorter than a record (" +
                        std::to_string(kMinBlockRecordBytes) + ")");
    }
    uint64_t index_bytes = 0, start = 0, total = 0, end = 0;
    if (!checked_mul(uint64_t{width}, uint64_t{count}, &index_bytes) ||
        !checked_add(uint64_t{kBlockHeaderBytes}, index_bytes, &start) || start > block.size) {
      fail(path, b, "an index of " + std::to_string(count) + " records does not fit in its " +
                        std::to_string(block.size) + " bytes");
    }
    if (!checked_add(key, uint64_t{count}, &end) || end > expected_records) {
      fail(path, b, "its records run past the shard's " + std::to_string(expected_records));
    }
    // Each length >= 1 and the lengths add up to the bytes after the index; the sum is checked as it
    // grows, so a length beyond the value stops it.
    const uint64_t room = block.size - start;
    if (width == 0 && (!checked_mul(uint64_t{common}, uint64_t{count}, &total) || total != room)) {
      fail(path, b, std::to_string(count) + " records of " + std::to_string(common) + " bytes do not fill its " +
                        std::to_string(room) + " bytes of records");
    }
    uint64_t offset = block.offset + start;
    for (uint32_t i = 0; i < count; ++i) {
      uint32_t length = common;
      if (width == 2) length = load<uint16_t>(p + kBlockHeaderBytes + 2 * uint64_t{i});
      if (width == 4) length = load<uint32_t>(p + kBlockHeaderBytes + 4 * uint64_t{i});
      if (length < kMinBlockRecordBytes) {
        fail(path, b, "record " + std::to_string(key + i) + " has length " + std::to_string(length) +
                          ", shorter than a record (" + std::to_string(kMinBlockRecordBytes) + ")");
      }
      if (width != 0 && (!checked_add(total, uint64_t{length}, &total) || total > room)) {
        fail(path, b, "its records' lengths run past its " + std::to_string(room) + " bytes of records");
      }
      RecordSpan span;
      span.offset = offset;
      span.size = length;
      records.push_back(span);
      offset += length;
    }
    if (total != room) {
      fail(path, b, "its records take " + std::to_string(total) + " bytes, the block holds " + std::to_string(room));
    }
    key = end;
  }
  if (key != expected_records) {
    throw CorruptShardError(path, "holds " + std::to_string(key) + " records, the manifest says " +
                                      std::to_string(expected_records));
  }
  return records;
}

}  // namespace fastload
