#include "format/record_decoder.h"

#include <lz4.h>
#include <zstd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <string>

#include "checked_math.h"
#include "errors.h"

namespace fastload {
namespace {

uint16_t load_u16(const uint8_t* p) noexcept {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}

uint32_t load_u32(const uint8_t* p) noexcept {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

uint64_t load_u64(const uint8_t* p) noexcept {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

std::string field_text(size_t f) { return "field " + std::to_string(f) + ": "; }

std::string hex64(uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  std::string out(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) out[static_cast<size_t>(i)] = digits[v & 0xF];
  return out;
}

// A field's codec must be able to hold it: the schema, not a record, decides.
void check_codec(const FieldSpec& spec, size_t f) {
  const std::string where = "schema: field " + std::to_string(f) + ": ";
  if (static_cast<int>(spec.codec) > kLastCodec) throw FastloadError(where + "unknown codec");
  if ((spec.codec == Codec::kLz4 || spec.codec == Codec::kLz4Shuffle) && spec.decoded_bytes > INT_MAX) {
    throw FastloadError(where + "an lz4 field holds at most " + std::to_string(INT_MAX) + " bytes");
  }
  if (spec.codec != Codec::kPng && spec.codec != Codec::kJpeg) return;
  const ImageGeometry& g = spec.image;
  const bool png = spec.codec == Codec::kPng;
  const bool channels_ok = png ? g.channels >= 1 && g.channels <= 4 : g.channels == 1 || g.channels == 3;
  const bool depth_ok = png ? spec.itemsize == 1 || spec.itemsize == 2 : spec.itemsize == 1;
  const uint32_t max_side = png ? INT32_MAX : 65535;
  if (!channels_ok || !depth_ok || g.height == 0 || g.width == 0 || g.height > max_side || g.width > max_side) {
    throw FastloadError(where + (png ? "png" : "jpeg") + " cannot hold " + std::to_string(g.channels) +
                        " channels of " + std::to_string(g.height) + "x" + std::to_string(g.width) + " with " +
                        std::to_string(spec.itemsize) + "-byte samples");
  }
  uint64_t bytes = spec.itemsize;
  if (!checked_mul(bytes, uint64_t{g.height}, &bytes) || !checked_mul(bytes, uint64_t{g.width}, &bytes) ||
      !checked_mul(bytes, uint64_t{g.channels}, &bytes) || bytes != spec.decoded_bytes) {
    throw FastloadError(where + "image geometry disagrees with the decoded size");
  }
}

}  // namespace

uint64_t checksum(const void* data, size_t size) noexcept { return XXH3_64bits(data, size); }

void unshuffle_bytes(const uint8_t* src, uint8_t* dst, size_t size, size_t itemsize) noexcept {
  const size_t n = size / itemsize;
  switch (itemsize) {
    case 2:
      for (size_t i = 0; i < n; ++i) {
        dst[2 * i] = src[i];
        dst[2 * i + 1] = src[n + i];
      }
      return;
    case 4:
      for (size_t i = 0; i < n; ++i) {
        for (size_t b = 0; b < 4; ++b) dst[4 * i + b] = src[b * n + i];
      }
      return;
    default:
      for (size_t b = 0; b < itemsize; ++b) {
        const uint8_t* plane = src + b * n;
        for (size_t i = 0; i < n; ++i) dst[i * itemsize + b] = plane[i];
      }
  }
}

void RecordDecoder::DCtxDeleter::operator()(ZSTD_DCtx_s* ctx) const noexcept { ZSTD_freeDCtx(ctx); }

RecordDecoder::RecordDecoder(std::vector<FieldSpec> fields, const DecoderOptions& options)
    : fields_(std::move(fields)),
      verify_(options.verify_checksums),
      version_(options.record_version),
      fingerprint_(options.schema_fingerprint) {
  if (version_ < 1 || version_ > kRecordVersion) throw FastloadError("unknown record version " + std::to_string(version_));
  if (fields_.empty() || fields_.size() > kMaxFields) {
    throw FastloadError("schema: " + std::to_string(fields_.size()) + " fields; a schema has 1 to " +
                        std::to_string(kMaxFields));
  }
  for (size_t f = 0; f < fields_.size(); ++f) {
    const FieldSpec& spec = fields_[f];
    if (spec.itemsize == 0 || spec.decoded_bytes % spec.itemsize != 0) {
      throw FastloadError("schema: field " + std::to_string(f) + ": decoded size is not a multiple of the item size");
    }
    check_codec(spec, f);
    sample_bytes_ = add_or_raise<FastloadError>(sample_bytes_, spec.decoded_bytes, "schema: sample size");
  }
  if (sample_bytes_ > options.max_sample_bytes || sample_bytes_ > SIZE_MAX) {
    throw FastloadError("schema: a sample of " + std::to_string(sample_bytes_) +
                        " decoded bytes exceeds the limit of " +
                        std::to_string(options.max_sample_bytes) + " bytes (max_sample_bytes)");
  }
  dctx_.reset(ZSTD_createDCtx());
  if (!dctx_) throw std::bad_alloc();
}

RecordDecoder::~RecordDecoder() = default;
RecordDecoder::RecordDecoder(RecordDecoder&&) noexcept = default;
RecordDecoder& RecordDecoder::operator=(RecordDecoder&&) noexcept = default;

void RecordDecoder::decompress(const uint8_t* src, size_t src_size, uint8_t* dst, size_t dst_size) {
  const unsigned long long content = ZSTD_getFrameContentSize(src, src_size);
  if (content == ZSTD_CONTENTSIZE_ERROR) throw DecodeError("not a zstd frame");
  if (content == ZSTD_CONTENTSIZE_UNKNOWN) throw DecodeError("zstd frame without content size");
  if (content != dst_size) {
    throw DecodeError("zstd frame holds " + std::to_string(content) + " bytes, expected " +
                      std::to_string(dst_size));
  }
  const size_t frame = ZSTD_findFrameCompressedSize(src, src_size);
  if (ZSTD_isError(frame)) {
    throw DecodeError(std::string("zstd frame truncated or malformed (") + ZSTD_getErrorName(frame) + ")");
  }
  if (frame != src_size) throw DecodeError("trailing bytes after the zstd frame");
  const size_t got = ZSTD_decompressDCtx(dctx_.get(), dst, dst_size, src, src_size);
  if (ZSTD_isError(got)) throw DecodeError(std::string("zstd error: ") + ZSTD_getErrorName(got));
  if (got != dst_size) throw DecodeError("zstd frame decoded to the wrong size");
}

void RecordDecoder::decode_payload(const FieldSpec& spec, const uint8_t* src, size_t src_size, uint8_t* dst,
                                   size_t dst_size) {
  const bool shuffled = (spec.codec == Codec::kZstdShuffle || spec.codec == Codec::kLz4Shuffle) && spec.itemsize > 1;
  uint8_t* out = dst;
  if (shuffled) {
    if (scratch_.size() < dst_size) scratch_.resize(dst_size);
    out = scratch_.data();
  }
  const auto start = std::chrono::steady_clock::now();
  switch (spec.codec) {
    case Codec::kZstd:
    case Codec::kZstdShuffle:
      decompress(src, src_size, out, dst_size);
      break;
    case Codec::kLz4:
    case Codec::kLz4Shuffle: {
      // Sizes fit an int: E is below the record size, D was checked in the constructor.
      if (src_size > INT_MAX) throw DecodeError("lz4 block too large");
      const int got = LZ4_decompress_safe(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(out),
                                          static_cast<int>(src_size), static_cast<int>(dst_size));
      if (got < 0) throw DecodeError("lz4 block malformed or truncated");
      if (static_cast<size_t>(got) != dst_size) {
        throw DecodeError("lz4 block holds " + std::to_string(got) + " bytes, expected " + std::to_string(dst_size));
      }
      break;
    }
    case Codec::kPng:
      images_.decode_png(src, src_size, spec.image, spec.itemsize, out, dst_size);
      break;
    case Codec::kJpeg:
      images_.decode_jpeg(src, src_size, spec.image, out, dst_size);
      break;
    default:
      throw DecodeError("unknown codec");
  }
  decompress_ns_ += static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
  if (shuffled) unshuffle_bytes(scratch_.data(), dst, dst_size, spec.itemsize);
}

void RecordDecoder::decode(const uint8_t* data, size_t size, uint8_t* const* dest, uint64_t key,
                           uint64_t expected) {
  const size_t nfields = fields_.size();
  const size_t fixed = version_ == 1 ? kRecordHeaderBytesV1 : kRecordHeaderBytes;
  if (size < kRecordHeaderBytesV1) {
    throw DecodeError("record of " + std::to_string(size) + " bytes is shorter than its header");
  }
  if (load_u32(data) != kRecordMagic) throw DecodeError("bad magic");
  const uint16_t version = load_u16(data + 4);
  if (version != version_) {
    throw DecodeError("record version " + std::to_string(version) + " in a version " + std::to_string(version_) +
                      " dataset (unsupported record version)");
  }
  const uint16_t count = load_u16(data + 6);
  if (count != nfields) {
    throw DecodeError("record has " + std::to_string(count) + " fields, schema has " + std::to_string(nfields));
  }
  const size_t header = add_or_throw(fixed, mul_or_throw(kFieldEntryBytes, nfields, "header"), "header");
  if (size < header) throw DecodeError("record truncated inside its header");
  if (version_ >= 2) {
    const uint64_t own_key = load_u64(data + 8);
    if (key != kAnyKey && own_key != key) {
      throw DecodeError("record of key " + std::to_string(own_key) + " found under key " + std::to_string(key) +
                        " (the shard's index is damaged)");
    }
    const uint64_t fingerprint = load_u64(data + 16);
    if (fingerprint != expected && version_ == 2) {
      throw DecodeError("written under another schema (fingerprint " + hex64(fingerprint) +
                        ", the manifest's schema has " + hex64(expected) + ")");
    }
    if (fingerprint != expected) {
      throw DecodeError("written under another schema, for another dataset or for another shard position (binding " +
                        hex64(fingerprint) + ", this shard of this dataset expects " + hex64(expected) +
                        "): a shard moved, copied from another dataset or rewritten while open");
    }
  }

  // First pass: validate every entry and the total length before writing.
  size_t payload_total = 0;
  for (size_t f = 0; f < nfields; ++f) {
    const uint8_t* e = data + fixed + kFieldEntryBytes * f;
    const FieldSpec& spec = fields_[f];
    if (e[0] != static_cast<uint8_t>(spec.codec)) {
      throw DecodeError(field_text(f) + "codec " + std::to_string(e[0]) + " differs from the schema's " +
                        std::to_string(static_cast<int>(spec.codec)));
    }
    if (e[1] != 0 || e[2] != 0 || e[3] != 0) throw DecodeError(field_text(f) + "reserved bytes are not zero");
    const uint64_t enc = load_u32(e + 4);
    const uint64_t dec = load_u64(e + 8);
    if (dec != spec.decoded_bytes) {
      throw DecodeError(field_text(f) + "decoded length " + std::to_string(dec) + " differs from the schema's " +
                        std::to_string(spec.decoded_bytes));
    }
    if (spec.codec == Codec::kRaw && enc != dec) {
      throw DecodeError(field_text(f) + "raw payload of " + std::to_string(enc) + " bytes, expected " +
                        std::to_string(dec));
    }
    if (!range_inside(header + payload_total, enc, size)) {
      throw DecodeError(field_text(f) + "length " + std::to_string(enc) + " runs past the end of the record");
    }
    payload_total += static_cast<size_t>(enc);
  }
  if (header + payload_total != size) {
    throw DecodeError("record has " + std::to_string(size - header - payload_total) + " bytes after its payloads");
  }

  const uint8_t* payload = data + header;
  for (size_t f = 0; f < nfields; ++f) {
    const uint8_t* e = data + fixed + kFieldEntryBytes * f;
    const FieldSpec& spec = fields_[f];
    const size_t enc = load_u32(e + 4);
    const size_t dec = static_cast<size_t>(spec.decoded_bytes);
    if (dest[f] == nullptr) {
      payload += enc;
      continue;
    }
    try {
      if (spec.codec == Codec::kRaw) {
        std::memcpy(dest[f], payload, dec);
      } else {
        decode_payload(spec, payload, enc, dest[f], dec);
      }
    } catch (const DecodeError& err) {
      throw DecodeError(field_text(f) + err.what());
    }
    if (verify_ && checksum(dest[f], dec) != load_u64(e + 16)) {
      throw DecodeError(field_text(f) + "checksum mismatch");
    }
    if (spec.boolean) {
      const uint8_t* begin = dest[f];
      const uint8_t* end = begin + dec;
      const uint8_t* bad = std::find_if(begin, end, [](uint8_t b) { return b > 1; });
      if (bad != end) {
        throw DecodeError(field_text(f) + "bool element " + std::to_string(bad - begin) + " holds byte " +
                          std::to_string(*bad) + ", not 0 or 1");
      }
    }
    payload += enc;
  }
}

}  // namespace fastload
