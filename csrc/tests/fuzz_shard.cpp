// libFuzzer target: the input is a whole shard file, read twice: as a format v4
// shard (packed: its LMDB values are blocks of records, record_blocks.h) and as
// a v1-v3 shard (one record per key). Each way it is validated in memory, then
// opened as a file (a memfd, through ShardFile: open, fstat, mmap, validate,
// and for v4 unpack the blocks), and every record is read and decoded under
// each codec the seed corpus uses, with record version 4 (packed) or 3. Nothing
// may crash, hang, leak or hit undefined behaviour; a corrupt input must end in
// CorruptShardError / CorruptRecordError / DecodeError.
//
// Built by `make fuzz` (clang, -fsanitize=fuzzer,address,undefined); the seed
// corpus comes from scripts/fuzz_corpus.py: v4 and v3 shards of records with
// an "image" field of 3x8x8 or 3x32x32 uint16 (raw, zstd, zstd-shuffle, lz4,
// lz4-shuffle or png, chw) or uint8 (jpeg, chw) and a raw int64 "label".
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "errors.h"
#include "format/lmdb_validator.h"
#include "format/record_blocks.h"
#include "format/record_decoder.h"
#include "reader/shard_reader.h"

using namespace fastload;

namespace {

constexpr uint32_t kImageSides[] = {8, 32};

// The record count the file claims (its newer meta page), so that mutated
// counts still reach the tree walk; 0 when the metas are unreadable.
uint64_t claimed_records(const uint8_t* data, size_t size) {
  auto u32 = [&](size_t at) { uint32_t v = 0; if (at + 4 <= size) std::memcpy(&v, data + at, 4); return v; };
  auto u64 = [&](size_t at) { uint64_t v = 0; if (at + 8 <= size) std::memcpy(&v, data + at, 8); return v; };
  const uint64_t psize = u32(40);
  if (psize == 0 || psize > size) return 0;
  const size_t meta = u64(psize + 144) > u64(144) ? psize : 0;
  return u64(meta + 120);
}

// For a v4 reading: the records the blocks claim (the sum of their headers' counts, saturating), so that
// mutated counts still reach the block checks; 0 when the LMDB structure is unreadable.
uint64_t claimed_block_records(const uint8_t* data, size_t size) {
  try {
    const ShardLayout layout = validate_lmdb(data, size, kAnyEntryCount, "<fuzz>", RunHeaders::when_read);
    uint64_t total = 0;
    for (const RecordSpan& block : layout.records) {
      uint32_t n = 0;
      if (block.size >= kBlockHeaderBytes) std::memcpy(&n, data + block.offset + 16, 4);
      total = total + n < total ? UINT64_MAX : total + n;
    }
    return total;
  } catch (const CorruptShardError&) {
    return 0;
  }
}

// A span that is not inside `outer` (the input, or a record's block after its header) is a bug.
void check_inside(const RecordSpan& span, uint64_t begin, uint64_t end) {
  if (span.offset < begin || span.offset > end || span.size > end - span.offset) __builtin_trap();
}

void decode_each(const ShardFile& shard, RecordDecoder& decoder, uint8_t* const* dest) {
  for (uint64_t key = 0; key < shard.records(); ++key) {
    try {
      const auto [bytes, size] = shard.record(key);  // checks the record's overflow run header
      decoder.decode(bytes, size, dest, key);
    } catch (const DecodeError&) {
    } catch (const CorruptRecordError&) {
    }
  }
}

void decode_all(const ShardFile& shard, uint16_t record_version) {
  std::vector<uint8_t> image(size_t{3} * kImageSides[1] * kImageSides[1] * 2), label(8);
  uint8_t* dest[] = {image.data(), label.data()};
  // Format v3 and v4 records carry their binding fingerprint (schema, dataset, shard); take the first record's, so
  // that the decoder gets past that check to the payloads (the harness cannot know the manifest).
  uint64_t fingerprint = 0;
  if (shard.records() > 0) {
    const auto [bytes, size] = shard.record(0);
    if (size >= 24) std::memcpy(&fingerprint, bytes + 16, 8);
  }
  for (const uint32_t side : kImageSides) {
    const uint64_t image_bytes = uint64_t{3} * side * side * 2;
    for (Codec codec : {Codec::kRaw, Codec::kZstd, Codec::kZstdShuffle, Codec::kLz4, Codec::kLz4Shuffle,
                        Codec::kPng}) {
      const FieldSpec image_spec{codec, 2, image_bytes, false, ImageGeometry{side, side, 3, true}};
      RecordDecoder decoder({image_spec, FieldSpec{Codec::kRaw, 8, 8}},
                            DecoderOptions{true, kDefaultMaxSampleBytes, record_version, fingerprint});
      decode_each(shard, decoder, dest);
    }
    const FieldSpec jpeg_spec{Codec::kJpeg, 1, image_bytes / 2, false, ImageGeometry{side, side, 3, true}};
    RecordDecoder jpeg({jpeg_spec, FieldSpec{Codec::kRaw, 8, 8}},
                       DecoderOptions{true, kDefaultMaxSampleBytes, record_version, fingerprint});
    decode_each(shard, jpeg, dest);
  }
}

// Validates the input in memory both ways of checking run headers; for v4 also unpacks its blocks and checks
// that every record lies inside its block's records and the blocks' records add up to `expected`.
void validate_in_memory(const uint8_t* data, size_t size, uint64_t expected, bool packed) {
  for (const RunHeaders headers : {RunHeaders::now, RunHeaders::when_read}) {
    try {
      const ShardLayout layout = validate_lmdb(data, size, packed ? kAnyEntryCount : expected, "<fuzz>", headers);
      for (const RecordSpan& span : layout.records) {
        check_inside(span, 0, size);
        // The run (its header before the value, its whole length) lies inside the input too.
        if (span.run_pages != 0 && (span.offset < 16 || (span.offset - 16) / layout.page_size + span.run_pages >
                                                            size / layout.page_size)) {
          __builtin_trap();
        }
        if (!run_header_ok(data, span, layout.page_size)) {
          static_cast<void>(run_header_problem(data, span, layout.page_size));
        }
      }
      if (!packed) continue;
      const std::vector<RecordSpan> records =
          unpack_blocks(data, layout.records, layout.page_size, expected, kBlockVersion, "<fuzz>");
      if (records.size() != expected) __builtin_trap();
      size_t next = 0;
      for (const RecordSpan& block : layout.records) {  // the records of each block, in order, inside it
        uint32_t n = 0;
        std::memcpy(&n, data + block.offset + 16, 4);
        uint8_t width = data[block.offset + 6];
        const uint64_t start = block.offset + kBlockHeaderBytes + uint64_t{width} * n;
        uint64_t at = start;
        for (uint32_t i = 0; i < n; ++i, ++next) {
          if (next >= records.size() || records[next].offset != at || records[next].size == 0) __builtin_trap();
          check_inside(records[next], start, block.offset + block.size);
          at += records[next].size;
        }
        if (at != block.offset + block.size) __builtin_trap();
      }
      if (next != records.size()) __builtin_trap();
    } catch (const CorruptShardError&) {
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const int fd = ::memfd_create("shard", MFD_CLOEXEC);
  const bool written = fd >= 0 && (size == 0 || ::write(fd, data, size) == static_cast<ssize_t>(size));
  for (const bool packed : {true, false}) {  // format v4 (blocks of records), then v1-v3 (a record per key)
    const uint64_t expected = packed ? claimed_block_records(data, size) : claimed_records(data, size);
    validate_in_memory(data, size, expected, packed);
    if (!written) continue;
    try {
      const ShardFile shard("/proc/self/fd/" + std::to_string(fd), expected, packed);
      decode_all(shard, packed ? kBlockVersion : 3);
    } catch (const CorruptShardError&) {
    } catch (const CorruptRecordError&) {
    }
  }
  if (fd >= 0) ::close(fd);
  return 0;
}
