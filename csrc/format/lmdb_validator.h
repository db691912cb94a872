// validate_lmdb: checks the on-disk structure of one LMDB shard before any
// LMDB code (liblmdb, py-lmdb) or any direct read touches it, and returns
// where every record lives.
//
// A shard is untrusted input; LMDB trusts its file (a bad page size, root page
// or node offset faults or aborts inside liblmdb). This parser reads the file
// as bytes, with every offset and size bounds-checked (checked_math.h), and
// accepts only what fastload's writer produces: one unnamed database without
// duplicates whose keys are 8-byte big-endian 0..n-1, written by LMDB 0.9
// (MDB_DATA_VERSION 1, 64-bit pgno_t/size_t, little-endian). Checked:
//   - both meta pages: P_META, magic 0xBEEFC0DE, version 1, the same page size,
//     a power of two in [4096, 32768] (what LMDB 0.9 writes: the OS page size,
//     capped at MAX_PAGESIZE), no environment or database flags, last page
//     inside the file; the meta with the larger txnid (meta 0 on a tie, as
//     LMDB picks) is the one read; its root lies in [2, last page];
//   - every branch and leaf page reachable from that root: its own page
//     number in the header, exact P_BRANCH / P_LEAF flags at the right depth,
//     mp_lower / mp_upper and every node offset, key and inline value inside
//     the page, at least two children per branch, no page reached twice;
//   - leaf nodes: no F_DUPDATA / F_SUBDATA, an 8-byte key equal to the next
//     expected index (so keys are exactly 0..n-1 in order), and separator keys
//     on branch pages that bound their subtrees (so a B-tree descent finds
//     each key);
//   - the first page of every overflow run: P_OVERFLOW, its own number, a run
//     length equal to what the value size needs, inside the file, overlapping
//     neither the tree nor another run;
//   - depth, page counts and entry count equal to the database record, and
//     the entry count equal to what the manifest says.
//
// Pure function of its input, thread-safe. Throws CorruptShardError(path,
// reason) on the first problem found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace fastload {

// Where one record's value lies in the shard file.
struct RecordSpan {
  uint64_t offset = 0;
  uint32_t size = 0;
};

struct ShardLayout {
  uint32_t page_size = 0;
  uint64_t last_page = 0;
  uint16_t depth = 0;
  uint64_t branch_pages = 0, leaf_pages = 0, overflow_pages = 0;
  std::vector<RecordSpan> records;  // records[key]; every span lies inside the file
};

// The smallest file a valid shard can be: two meta pages of the smallest page
// size. Readers check this before mapping the file.
constexpr uint64_t kMinShardBytes = 2 * 4096;

// Validates the `size` bytes at `data` (a whole shard file) for a shard that
// must hold `expected_records` records. `path` only names the file in errors.
ShardLayout validate_lmdb(const uint8_t* data, uint64_t size, uint64_t expected_records, const std::string& path);

}  // namespace fastload
