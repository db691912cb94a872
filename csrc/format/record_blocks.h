// Format v4 blocks: the records of a shard packed into LMDB values of about
// 1 MiB (docs/FORMAT.md, "A block"; python/fastload/format/_blocks.py writes
// them). unpack_blocks turns the validated layout of a v4 shard (one span per
// block) into one span per record, checking every block first:
//   - the block's overflow run header (it lies on the block's first page,
//     which the header read touches anyway);
//   - magic "FLBK", version, index width 0/2/4, reserved byte zero, the first
//     key equal to the records of the blocks before it, at least one record;
//   - with width 0 a common length, else a zero common length and an indexed
//     length per record, each at least kMinBlockRecordBytes;
//   - header + index + the records' lengths equal to the value's length, every
//     sum and product overflow-checked;
//   - the records of all blocks adding up to `expected_records`.
// A record's own key and binding are checked by the record decoder as in v3.
//
// Reads the block headers and indexes only (for 1 MiB blocks of small records
// the index is a few pages of each block). Pure function of its input,
// thread-safe; throws CorruptShardError(path, "block B: ...").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "format/lmdb_validator.h"

namespace fastload {

constexpr uint16_t kBlockVersion = 4;  // the first format version whose shards hold blocks
constexpr size_t kBlockHeaderBytes = 24;
// The shortest record a block may index: a v4 record's header and one field entry. Longer than any span
// the reader keeps per record (16 bytes), so a crafted shard cannot make the reader hold more memory
// than a third of its size.
constexpr uint32_t kMinBlockRecordBytes = 48;

// Returns the spans of the records held by the blocks `blocks` (spans inside the
// validated file at `data`, page size `page_size`), in key order.
std::vector<RecordSpan> unpack_blocks(const uint8_t* data, const std::vector<RecordSpan>& blocks, uint32_t page_size,
                                      uint64_t expected_records, uint16_t version, const std::string& path);

}  // namespace fastload
