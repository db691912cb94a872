// RecordDecoder: parses and decodes one binary record (docs/FORMAT.md) into
// caller-owned destination buffers, one per field.
//
// Every length in the header is checked against the record's size and the
// schema before a byte is copied. zstd frames are decompressed straight into
// the destination (or into a per-decoder scratch buffer when the field is
// byte-shuffled), and the XXH3-64 of the decoded bytes is verified. A v2
// record must name the key it was read under and the fingerprint of the
// schema it is read with; a v3 record the key and its binding fingerprint
// (schema, dataset id and shard index; the caller passes each shard's);
// bool fields must hold only bytes 0 and 1.
//
// The schema itself is checked once, in the constructor: every field's
// decoded size is a multiple of its item size and one sample's decoded bytes
// (summed with checked arithmetic) stay within `max_sample_bytes`, so no size
// derived from the schema can wrap around later (FastloadError otherwise).
//
// Thread safety: one decoder per thread (it owns a zstd context and scratch).
// lz4 blocks are decompressed with LZ4_decompress_safe into exactly the
// field's decoded bytes; png and jpeg payloads go through ImageDecoder
// (image_decode.h), whose header checks come before any byte is written.
//
// decode() throws DecodeError with a reason; the caller adds the file and record.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "format/image_decode.h"

struct ZSTD_DCtx_s;

namespace fastload {

enum class Codec : uint8_t { kRaw = 0, kZstd = 1, kZstdShuffle = 2, kLz4 = 3, kLz4Shuffle = 4, kPng = 5, kJpeg = 6 };
constexpr int kLastCodec = 6;

constexpr uint32_t kRecordMagic = 0x43524C46u;  // bytes "FLRC"
constexpr uint16_t kRecordVersion = 4;            // what writers write; readers also take 1 to 3
constexpr size_t kRecordHeaderBytesV1 = 8;        // magic, version, field count
constexpr size_t kRecordHeaderBytes = 24;         // v2, v3 add the key and the (binding) fingerprint
constexpr size_t kFieldEntryBytes = 24;
// Fields per schema (python/fastload/format/_record.py MAX_FIELDS): the header's count is
// 16-bit, but a real schema has a few dozen fields, and each costs work and a buffer per batch.
constexpr size_t kMaxFields = 1024;
constexpr uint64_t kAnyKey = UINT64_MAX;          // decode() without a key to check

// What the schema says one field of every record holds.
struct FieldSpec {
  Codec codec;
  uint32_t itemsize;        // bytes per element: the shuffle's stride
  uint64_t decoded_bytes;   // product of the shape times itemsize
  bool boolean = false;     // dtype bool: every decoded byte must be 0 or 1
  ImageGeometry image{};    // png and jpeg: the image the payload must hold
};

// The largest sample (all fields' decoded bytes together) a reader accepts by
// default: 2 GiB. A schema declaring more is refused before any allocation;
// Python's FASTLOAD_MAX_SAMPLE_BYTES changes the bound (docs/FORMAT.md).
constexpr uint64_t kDefaultMaxSampleBytes = uint64_t{2} << 30;

struct DecoderOptions {
  bool verify_checksums = true;
  uint64_t max_sample_bytes = kDefaultMaxSampleBytes;
  // The record version every record must have: the manifest's format_version
  // (1, 2 or 3). In v2 each record also names its key and its schema's
  // fingerprint (docs/FORMAT.md), which must equal these; in v3 the
  // fingerprint is the shard's binding, given to decode() per shard (this
  // one is the default).
  uint16_t record_version = kRecordVersion;
  uint64_t schema_fingerprint = 0;
};

// XXH3-64 (seed 0) of a byte range: the record checksum.
uint64_t checksum(const void* data, size_t size) noexcept;

class RecordDecoder {
 public:
  RecordDecoder(std::vector<FieldSpec> fields, const DecoderOptions& options);
  ~RecordDecoder();
  RecordDecoder(const RecordDecoder&) = delete;
  RecordDecoder& operator=(const RecordDecoder&) = delete;
  RecordDecoder(RecordDecoder&&) noexcept;
  RecordDecoder& operator=(RecordDecoder&&) noexcept;

  // Decodes `size` bytes at `data` into dest[f] (decoded_bytes long each).
  // A null dest[f] skips that field (validated, not decoded or verified).
  // `key` is the LMDB key the record was read under: a v2 record carrying
  // another key is refused (kAnyKey skips that check).
  void decode(const uint8_t* data, size_t size, uint8_t* const* dest, uint64_t key = kAnyKey) {
    decode(data, size, dest, key, fingerprint_);
  }
  // As above, the record's fingerprint field checked against `fingerprint`
  // (v3: the binding of the shard it was read from).
  void decode(const uint8_t* data, size_t size, uint8_t* const* dest, uint64_t key, uint64_t fingerprint);

  const std::vector<FieldSpec>& fields() const noexcept { return fields_; }

  // Decoded bytes of one whole sample (every field), <= max_sample_bytes.
  uint64_t sample_bytes() const noexcept { return sample_bytes_; }

  // Nanoseconds spent inside zstd, lz4 and the image libraries so far (the rest of decode() is copy and verify).
  uint64_t decompress_ns() const noexcept { return decompress_ns_; }

 private:
  struct DCtxDeleter {
    void operator()(ZSTD_DCtx_s* ctx) const noexcept;
  };
  void decompress(const uint8_t* src, size_t src_size, uint8_t* dst, size_t dst_size);
  void decode_payload(const FieldSpec& spec, const uint8_t* src, size_t src_size, uint8_t* dst, size_t dst_size);

  std::vector<FieldSpec> fields_;
  bool verify_;
  uint16_t version_;
  uint64_t fingerprint_;
  uint64_t sample_bytes_ = 0;
  std::unique_ptr<ZSTD_DCtx_s, DCtxDeleter> dctx_;
  std::vector<uint8_t> scratch_;
  ImageDecoder images_;
  uint64_t decompress_ns_ = 0;
};

// Reverses the byte shuffle: src holds byte 0 of every element, then byte 1,
// ...; dst gets the elements back. size must be a multiple of itemsize.
void unshuffle_bytes(const uint8_t* src, uint8_t* dst, size_t size, size_t itemsize) noexcept;

}  // namespace fastload
