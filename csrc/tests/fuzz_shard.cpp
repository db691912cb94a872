// libFuzzer target: the input is a whole shard file. It is validated in
// memory, then opened as a file (a memfd, through ShardFile: open, fstat, mmap,
// validate), and every record is read and decoded under each codec the seed
// corpus uses. Nothing may crash, hang, leak or hit undefined behaviour; a
// corrupt input must end in CorruptShardError / CorruptRecordError /
// DecodeError.
//
// Built by `make fuzz` (clang, -fsanitize=fuzzer,address,undefined); the seed
// corpus comes from scripts/fuzz_corpus.py: shards of records with an
// "image" field of 3x8x8 or 3x32x32 uint16 (raw, zstd, zstd-shuffle, lz4,
// lz4-shuffle or png, chw) or uint8 (jpeg, chw) and a raw int64 "label".
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "errors.h"
#include "format/lmdb_validator.h"
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

void decode_all(const ShardFile& shard) {
  std::vector<uint8_t> image(size_t{3} * kImageSides[1] * kImageSides[1] * 2), label(8);
  uint8_t* dest[] = {image.data(), label.data()};
  // Format v3 records carry their binding fingerprint (schema, dataset, shard); take the first record's, so that the
  // decoder gets past that check to the payloads (the harness cannot know the manifest).
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
                            DecoderOptions{true, kDefaultMaxSampleBytes, kRecordVersion, fingerprint});
      decode_each(shard, decoder, dest);
    }
    const FieldSpec jpeg_spec{Codec::kJpeg, 1, image_bytes / 2, false, ImageGeometry{side, side, 3, true}};
    RecordDecoder jpeg({jpeg_spec, FieldSpec{Codec::kRaw, 8, 8}},
                       DecoderOptions{true, kDefaultMaxSampleBytes, kRecordVersion, fingerprint});
    decode_each(shard, jpeg, dest);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const uint64_t expected = claimed_records(data, size);
  for (const RunHeaders headers : {RunHeaders::now, RunHeaders::when_read}) {
    try {
      const ShardLayout layout = validate_lmdb(data, size, expected, "<fuzz>", headers);
      for (const RecordSpan& span : layout.records) {
        if (span.offset > size || span.size > size - span.offset) __builtin_trap();  // a span outside the input
        // The run (its header before the value, its whole length) lies inside the input too.
        if (span.run_pages != 0 && (span.offset < 16 || (span.offset - 16) / layout.page_size + span.run_pages >
                                                            size / layout.page_size)) {
          __builtin_trap();
        }
        if (!run_header_ok(data, span, layout.page_size)) {
          static_cast<void>(run_header_problem(data, span, layout.page_size));
        }
      }
    } catch (const CorruptShardError&) {
    }
  }
  const int fd = ::memfd_create("shard", MFD_CLOEXEC);
  if (fd < 0) return 0;
  if (size == 0 || ::write(fd, data, size) == static_cast<ssize_t>(size)) {
    try {
      const ShardFile shard("/proc/self/fd/" + std::to_string(fd), expected);
      decode_all(shard);
    } catch (const CorruptShardError&) {
    } catch (const CorruptRecordError&) {
    }
  }
  ::close(fd);
  return 0;
}
