#include "reader/floors.h"

#include <lz4.h>
#include <zstd.h>

#include <climits>
#include <cstring>
#include <memory>
#include <string>

#include "errors.h"

namespace fastload {

void decode_all(const uint8_t* blob, const std::vector<uint64_t>& offsets, const std::vector<FieldSpec>& fields,
                const std::vector<uint8_t*>& dest, const DecoderOptions& options) {
  RecordDecoder decoder(fields, options);
  std::vector<uint8_t*> at(fields.size());
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    for (size_t f = 0; f < fields.size(); ++f) at[f] = dest[f] + i * static_cast<size_t>(fields[f].decoded_bytes);
    try {
      decoder.decode(blob + offsets[i], static_cast<size_t>(offsets[i + 1] - offsets[i]), at.data());
    } catch (const DecodeError& e) {
      throw CorruptRecordError("<records>", i, e.what());
    }
  }
}

void library_decode_all(Codec codec, const uint8_t* blob, const std::vector<uint64_t>& offsets, uint8_t* dest,
                        size_t decoded_bytes, const ImageGeometry& geometry) {
  std::unique_ptr<void, void (*)(void*) noexcept> tj(codec == Codec::kJpeg ? plain_jpeg_handle() : nullptr,
                                                     plain_jpeg_free);
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const uint8_t* src = blob + offsets[i];
    const auto size = static_cast<size_t>(offsets[i + 1] - offsets[i]);
    uint8_t* dst = dest + i * decoded_bytes;
    bool ok = false;
    switch (codec) {
      case Codec::kLz4:
      case Codec::kLz4Shuffle:
        ok = size <= INT_MAX && decoded_bytes <= INT_MAX &&
             LZ4_decompress_safe(reinterpret_cast<const char*>(src), reinterpret_cast<char*>(dst),
                                 static_cast<int>(size), static_cast<int>(decoded_bytes)) >= 0;
        break;
      case Codec::kZstd:
      case Codec::kZstdShuffle:
        ok = !ZSTD_isError(ZSTD_decompress(dst, decoded_bytes, src, size));
        break;
      case Codec::kPng:
        ok = plain_png_decode(src, size, dst, decoded_bytes);
        break;
      case Codec::kJpeg:
        ok = tj != nullptr && plain_jpeg_decode(tj.get(), src, size, dst, geometry);
        break;
      case Codec::kRaw:
        std::memcpy(dst, src, decoded_bytes);
        ok = size == decoded_bytes;
        break;
    }
    if (!ok) throw DecodeError("payload " + std::to_string(i) + ": the library failed");
  }
}

uint64_t lookup_all(const ShardSet& shards, const std::vector<uint64_t>& indices) {
  uint64_t total = 0;
  for (uint64_t index : indices) {
    const auto [shard, key] = shards.locate(index);
    total += shards.shard(shard).record_location(key).second;
  }
  return total;
}

}  // namespace fastload
