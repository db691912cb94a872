// Single-threaded reference loops that the benchmarks use as floors: what
// the hardware and libraries do with no thread pool and no Python per record.
//
// Thread safety: free functions; each call uses only its arguments.
// Errors: as RecordDecoder and ShardFile (DecodeError, CorruptRecordError).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "format/record_decoder.h"
#include "reader/shard_reader.h"

namespace fastload {

// Decodes records laid end to end in `blob` (record i spans offsets[i] to
// offsets[i+1]) into dest[f] + i * decoded_bytes(f), in one thread.
void decode_all(const uint8_t* blob, const std::vector<uint64_t>& offsets, const std::vector<FieldSpec>& fields,
                const std::vector<uint8_t*>& dest, const DecoderOptions& options);

// Decodes payloads laid end to end (payload i spans offsets[i] to
// offsets[i+1]) with the codec's library alone, one thread, into dest + i *
// decoded_bytes: LZ4_decompress_safe, ZSTD_decompress, libspng's and
// TurboJPEG's image decode (interleaved, no header checks, no checksum).
// Throws DecodeError when the library fails.
void library_decode_all(Codec codec, const uint8_t* blob, const std::vector<uint64_t>& offsets, uint8_t* dest,
                        size_t decoded_bytes, const ImageGeometry& geometry);

// Looks up every global index in one thread without decoding; returns the
// total record bytes found.
uint64_t lookup_all(const ShardSet& shards, const std::vector<uint64_t>& indices);

}  // namespace fastload
