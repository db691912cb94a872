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
//   - every overflow run: inside the file, overlapping neither the tree nor
//     another run, and its first page's header (P_OVERFLOW, its own number, a
//     run length equal to what the value size needs). That header lies on the
//     page the value starts on: with RunHeaders::when_read the walk does not
//     read it (which would touch a page of every record, so map the whole
//     file, before the first record is read: most of a fresh process's cost
//     of opening a dataset of small records); the reader checks it with
//     run_header_ok() when it reads the record (ShardFile::record);
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
  uint32_t run_pages = 0;  // a value on an overflow run: the run's length (its header precedes `offset`); else 0
};

// When validate_lmdb checks the header of each record's overflow run.
enum class RunHeaders { now, when_read };

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

// `expected_records` for a shard whose entries are not records but blocks of them (format v4,
// record_blocks.h): any number of entries, at least one, as the used meta page says.
constexpr uint64_t kAnyEntryCount = ~uint64_t{0};

// Validates the `size` bytes at `data` (a whole shard file) for a shard that
// must hold `expected_records` records (entries; or kAnyEntryCount). `path` only names the file in errors.
// With RunHeaders::when_read the overflow runs' headers are left to
// run_header_ok(), which the caller must apply before it reads a record.
ShardLayout validate_lmdb(const uint8_t* data, uint64_t size, uint64_t expected_records, const std::string& path,
                          RunHeaders run_headers = RunHeaders::now);

// Whether the header of the overflow run holding `span` in the validated file
// at `data` (page size `page_size`) is right (true for a value not on an
// overflow run). Reads the 16 bytes before the value.
bool run_header_ok(const uint8_t* data, const RecordSpan& span, uint32_t page_size) noexcept;

// What is wrong with that header, for an error message; empty when it is right.
std::string run_header_problem(const uint8_t* data, const RecordSpan& span, uint32_t page_size);

}  // namespace fastload
