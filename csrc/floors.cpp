#include "floors.h"

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

uint64_t lookup_all(const ShardSet& shards, const std::vector<uint64_t>& indices) {
  uint64_t total = 0;
  for (uint64_t index : indices) {
    const auto [shard, key] = shards.locate(index);
    total += shards.shard(shard).record(key).second;
  }
  return total;
}

}  // namespace fastload
