#include "format/lmdb_validator.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "checked_math.h"
#include "errors.h"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "lmdb_validator reads LMDB's native-endian fields as little-endian"
#endif

namespace fastload {
namespace {

// LMDB 0.9 on-disk layout (mdb.c: MDB_page, MDB_meta, MDB_db, MDB_node) with
// 64-bit pgno_t and size_t.
constexpr uint32_t kMagic = 0xBEEFC0DE;
constexpr uint32_t kDataVersion = 1;
constexpr uint64_t kPageHeader = 16;  // PAGEHDRSZ: pgno u64, pad u16, flags u16, lower/upper u16 (or pages u32)
constexpr uint64_t kNodeHeader = 8;   // NODESIZE: lo u16, hi u16, flags u16, ksize u16
constexpr uint64_t kKeyBytes = 8;
constexpr uint16_t kBranch = 0x01, kLeaf = 0x02, kOverflow = 0x04, kMeta = 0x08;
constexpr uint16_t kBigData = 0x01;
constexpr uint64_t kInvalidPage = ~uint64_t{0};
constexpr uint16_t kMaxDepth = 32;  // CURSOR_STACK: LMDB cannot descend deeper
constexpr uint32_t kMinPage = 4096, kMaxPage = 32768;
// Environment flags a meta page may carry: MDB_INTEGERKEY (always set on the
// free database) and MDB_NOSUBDIR; MDB_FIXEDMAP and anything else is refused.
constexpr uint16_t kEnvFlagsRequired = 0x0008, kEnvFlagsAllowed = 0x0008 | 0x4000;

// Offsets inside a meta page.
constexpr uint64_t kMetaMagic = kPageHeader, kMetaVersion = kPageHeader + 4;
constexpr uint64_t kFreeDb = kPageHeader + 24, kMainDb = kPageHeader + 72;
constexpr uint64_t kMetaLastPage = kPageHeader + 120, kMetaTxnid = kPageHeader + 128;
constexpr uint64_t kMetaEnd = kPageHeader + 136;

template <typename T>
T load(const uint8_t* p) noexcept {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

uint64_t load_key(const uint8_t* p) noexcept {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | p[i];
  return v;
}

struct Db {
  uint32_t pad = 0;
  uint16_t flags = 0, depth = 0;
  uint64_t branch = 0, leaf = 0, overflow = 0, entries = 0, root = 0;
};

struct Meta {
  uint32_t page_size = 0;
  uint16_t env_flags = 0;
  Db main;
  uint64_t last_page = 0, txnid = 0;
};

Db load_db(const uint8_t* p) noexcept {
  Db db;
  db.pad = load<uint32_t>(p);
  db.flags = load<uint16_t>(p + 4);
  db.depth = load<uint16_t>(p + 6);
  db.branch = load<uint64_t>(p + 8);
  db.leaf = load<uint64_t>(p + 16);
  db.overflow = load<uint64_t>(p + 24);
  db.entries = load<uint64_t>(p + 32);
  db.root = load<uint64_t>(p + 40);
  return db;
}

bool power_of_two(uint64_t v) noexcept { return v != 0 && (v & (v - 1)) == 0; }

class Validator {
 public:
  Validator(const uint8_t* data, uint64_t size, uint64_t expected, const std::string& path, RunHeaders run_headers)
      : data_(data), run_headers_(run_headers), size_(size), expected_(expected), path_(path) {}

  ShardLayout run() {
    if (size_ == 0) fail("the file is empty (0 bytes)");
    if (size_ < kMinShardBytes) fail(std::to_string(size_) + " bytes, too short for an LMDB file");
    const Meta m0 = read_meta(0, 0);
    const uint32_t psize = m0.page_size;
    if (size_ < 2 * uint64_t{psize}) fail("the file is shorter than its two meta pages");
    const Meta m1 = read_meta(psize, 1);
    if (m1.page_size != psize) {
      fail("meta pages disagree on the page size (" + std::to_string(psize) + " and " +
           std::to_string(m1.page_size) + ")");
    }
    psize_ = psize;
    const bool second = m1.txnid > m0.txnid;  // LMDB reads the newer meta, meta 0 on a tie
    check_last_page(second ? m0 : m1, second ? 0 : 1, false);
    const Meta& meta = second ? m1 : m0;
    check_last_page(meta, second ? 1 : 0, true);
    last_page_ = meta.last_page;
    layout_.page_size = psize;
    layout_.last_page = meta.last_page;
    layout_.depth = meta.main.depth;
    walk(meta.main);
    return std::move(layout_);
  }

 private:
  [[noreturn]] void fail(const std::string& reason) const {
    throw CorruptShardError(path_, "not a readable LMDB file: " + reason);
  }

  // Problems that are not about the LMDB structure itself.
  [[noreturn]] void fail_plain(const std::string& reason) const { throw CorruptShardError(path_, reason); }

  Meta read_meta(uint64_t offset, int index) const {
    const std::string name = "meta page " + std::to_string(index);
    if (!range_inside(offset, kMetaEnd, size_)) fail(name + " lies past the end of the file");
    const uint8_t* p = data_ + offset;
    if (load<uint16_t>(p + 10) != kMeta) fail(name + ": page flags are not P_META");
    if (load<uint64_t>(p) != static_cast<uint64_t>(index)) fail(name + ": wrong page number in its header");
    if (load<uint32_t>(p + kMetaMagic) != kMagic) fail(name + ": bad magic (not an LMDB file)");
    const uint32_t version = load<uint32_t>(p + kMetaVersion);
    if (version != kDataVersion) fail(name + ": format version " + std::to_string(version) + ", expected 1");
    Meta m;
    const Db free_db = load_db(p + kFreeDb);
    m.page_size = free_db.pad;
    m.env_flags = free_db.flags;
    m.main = load_db(p + kMainDb);
    m.last_page = load<uint64_t>(p + kMetaLastPage);
    m.txnid = load<uint64_t>(p + kMetaTxnid);
    if (!power_of_two(m.page_size) || m.page_size < kMinPage || m.page_size > kMaxPage) {
      fail(name + ": page size " + std::to_string(m.page_size) + " is not a power of two in [4096, 32768]");
    }
    if ((m.env_flags & kEnvFlagsRequired) != kEnvFlagsRequired || (m.env_flags & ~kEnvFlagsAllowed) != 0) {
      fail(name + ": unexpected environment flags " + std::to_string(m.env_flags));
    }
    if (m.main.flags != 0 || m.main.pad != 0) {
      fail(name + ": the database has flags " + std::to_string(m.main.flags) +
           " (fastload writes one plain database)");
    }
    return m;
  }

  void check_last_page(const Meta& m, int index, bool used) {
    const std::string name = "meta page " + std::to_string(index);
    uint64_t pages = 0, bytes = 0;
    if (m.last_page < 1 || !checked_add(m.last_page, uint64_t{1}, &pages) ||
        !checked_mul(pages, uint64_t{m.page_size}, &bytes)) {
      fail(name + ": last page " + std::to_string(m.last_page) + " is impossible");
    }
    if (bytes > size_) {
      fail_plain("truncated: the file has " + std::to_string(size_) + " bytes, its LMDB pages need " +
           std::to_string(bytes));
    }
    const Db& db = m.main;
    if (!used) {
      if (db.root != kInvalidPage && (db.root < 2 || db.root > m.last_page)) fail(name + ": root page out of range");
      return;
    }
    if (expected_ == kAnyEntryCount) {  // v4: the entries are blocks, as many as the file says (at least one)
      if (db.entries == 0 || db.entries == kAnyEntryCount) {
        fail_plain("holds " + std::to_string(db.entries) + " blocks");
      }
      expected_ = db.entries;
    } else if (db.entries != expected_) {
      fail_plain("holds " + std::to_string(db.entries) + " records, the manifest says " + std::to_string(expected_));
    }
    if (expected_ == 0) {
      if (db.root != kInvalidPage || db.depth != 0) fail(name + ": an empty database with a root page");
      return;
    }
    if (db.root < 2 || db.root > m.last_page) {
      fail(name + ": root page " + std::to_string(db.root) + " is not in [2, " + std::to_string(m.last_page) + "]");
    }
    if (db.depth < 1 || db.depth > kMaxDepth) fail(name + ": tree depth " + std::to_string(db.depth));
  }

  // Marks page `pgno` as used; a page used twice is a cycle or an overlap.
  void claim(uint64_t pgno, const char* what) {
    if (used_.empty()) used_.assign(last_page_ + 1, 0);
    if (used_[pgno]) fail(std::string(what) + " page " + std::to_string(pgno) + " is used twice");
    used_[pgno] = 1;
  }

  const uint8_t* page(uint64_t pgno, const char* what) const {
    if (pgno < 2 || pgno > last_page_) {
      fail(std::string(what) + " page number " + std::to_string(pgno) + " is not in [2, " +
           std::to_string(last_page_) + "]");
    }
    return data_ + pgno * psize_;  // (last_page_ + 1) * psize_ <= size_ was checked
  }

  struct Frame {
    uint64_t pgno;
    uint16_t level;
    uint64_t lo;     // every key below this page is >= lo
    uint64_t hi;     // ... and < hi when bounded
    bool bounded;
  };

  // The node pointers of a branch or leaf page, each checked to leave room
  // for a node header inside the page.
  uint64_t node_count(const uint8_t* p, uint64_t pgno) const {
    const uint16_t lower = load<uint16_t>(p + 12), upper = load<uint16_t>(p + 14);
    if (lower < kPageHeader || (lower & 1) != 0 || lower > upper || upper > psize_) {
      fail("page " + std::to_string(pgno) + ": mp_lower " + std::to_string(lower) + " / mp_upper " +
           std::to_string(upper) + " are not a valid free range");
    }
    return (lower - kPageHeader) / 2;
  }

  uint64_t node_offset(const uint8_t* p, uint64_t pgno, uint64_t i) const {
    const uint16_t upper = load<uint16_t>(p + 14);
    const uint64_t off = load<uint16_t>(p + kPageHeader + 2 * i);
    if (off < upper || (off & 1) != 0 || !range_inside(off, kNodeHeader, psize_)) {
      fail("page " + std::to_string(pgno) + ": node " + std::to_string(i) + " offset " + std::to_string(off) +
           " lies outside the page's node area");
    }
    return off;
  }

  void walk(const Db& db) {
    if (expected_ == 0) return;
    std::vector<Frame> stack{{db.root, 0, 0, 0, false}};
    while (!stack.empty()) {
      const Frame f = stack.back();
      stack.pop_back();
      const uint8_t* p = page(f.pgno, "tree");
      claim(f.pgno, "tree");
      if (load<uint64_t>(p) != f.pgno) fail("page " + std::to_string(f.pgno) + ": wrong page number in its header");
      const uint16_t flags = load<uint16_t>(p + 10);
      const bool leaf_level = f.level + 1 == db.depth;
      if (flags != (leaf_level ? kLeaf : kBranch)) {
        fail("page " + std::to_string(f.pgno) + ": flags " + std::to_string(flags) + ", expected a " +
             (leaf_level ? "leaf" : "branch") + " page at depth " + std::to_string(f.level));
      }
      if (leaf_level) {
        ++layout_.leaf_pages;
        leaf(p, f);
      } else {
        ++layout_.branch_pages;
        branch(p, f, stack);
      }
    }
    const std::string where = "the database record says ";
    if (next_key_ != expected_) fail("the tree holds " + std::to_string(next_key_) + " records");
    if (layout_.branch_pages != db.branch || layout_.leaf_pages != db.leaf || layout_.overflow_pages != db.overflow) {
      fail(where + std::to_string(db.branch) + "/" + std::to_string(db.leaf) + "/" + std::to_string(db.overflow) +
           " branch/leaf/overflow pages, the tree has " + std::to_string(layout_.branch_pages) + "/" +
           std::to_string(layout_.leaf_pages) + "/" + std::to_string(layout_.overflow_pages));
    }
  }

  void branch(const uint8_t* p, const Frame& f, std::vector<Frame>& stack) {
    const uint64_t n = node_count(p, f.pgno);
    if (n < 2) fail("branch page " + std::to_string(f.pgno) + " has " + std::to_string(n) + " children");
    const size_t first = stack.size();
    stack.resize(first + n);
    uint64_t lo = f.lo;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t off = node_offset(p, f.pgno, i);
      const uint8_t* node = p + off;
      const uint64_t ksize = load<uint16_t>(node + 6);
      if (!range_inside(off + kNodeHeader, ksize, psize_) || (i > 0 && ksize != kKeyBytes)) {
        fail("branch page " + std::to_string(f.pgno) + ": node " + std::to_string(i) + " key size " +
             std::to_string(ksize));
      }
      if (i > 0) {
        const uint64_t sep = load_key(node + kNodeHeader);
        if (sep <= lo || (f.bounded && sep >= f.hi)) {
          fail("branch page " + std::to_string(f.pgno) + ": separator key " + std::to_string(sep) + " out of order");
        }
        stack[first + n - i].hi = sep;  // the previous child ends below this key
        stack[first + n - i].bounded = true;
        lo = sep;
      }
      const uint64_t child = uint64_t{load<uint16_t>(node)} | (uint64_t{load<uint16_t>(node + 2)} << 16) |
                             (uint64_t{load<uint16_t>(node + 4)} << 32);
      // Children go on the stack right to left, so the leftmost is walked first.
      stack[first + n - 1 - i] = Frame{child, static_cast<uint16_t>(f.level + 1), lo, f.hi, f.bounded};
    }
  }

  void leaf(const uint8_t* p, const Frame& f) {
    const uint64_t n = node_count(p, f.pgno);
    if (n < 1) fail("leaf page " + std::to_string(f.pgno) + " is empty");
    const uint64_t base = f.pgno * psize_;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t off = node_offset(p, f.pgno, i);
      const uint8_t* node = p + off;
      // Built only for an error message: a string per record would be most of the walk's time.
      const auto where = [&] { return node_name(f.pgno, i); };
      const uint16_t nflags = load<uint16_t>(node + 4);
      const uint64_t ksize = load<uint16_t>(node + 6);
      const uint64_t dsize = uint64_t{load<uint16_t>(node)} | (uint64_t{load<uint16_t>(node + 2)} << 16);
      if (nflags != 0 && nflags != kBigData) fail(where() + ": node flags " + std::to_string(nflags));
      if (ksize != kKeyBytes || !range_inside(off + kNodeHeader, kKeyBytes, psize_)) {
        fail(where() + ": key size " + std::to_string(ksize) + ", expected 8");
      }
      const uint64_t key = load_key(node + kNodeHeader);
      if (key != next_key_ || key < f.lo || (f.bounded && key >= f.hi)) {
        fail(where() + ": key " + std::to_string(key) + " where key " + std::to_string(next_key_) + " belongs");
      }
      const uint64_t data_off = off + kNodeHeader + kKeyBytes;
      RecordSpan span;
      span.size = static_cast<uint32_t>(dsize);
      if (nflags == kBigData) {
        if (!range_inside(data_off, 8, psize_)) fail(where() + ": overflow page number outside the page");
        span.offset = overflow(load<uint64_t>(node + kNodeHeader + kKeyBytes), dsize, f.pgno, i, &span.run_pages);
      } else {
        if (!range_inside(data_off, dsize, psize_)) {
          fail(where() + ": value of " + std::to_string(dsize) + " bytes runs past the page");
        }
        span.offset = base + data_off;
      }
      layout_.records.push_back(span);
      ++next_key_;
    }
  }

  static std::string node_name(uint64_t leaf_pgno, uint64_t node) {
    return "leaf page " + std::to_string(leaf_pgno) + " node " + std::to_string(node);
  }

  // Checks the overflow run holding a value of `dsize` bytes, named by node
  // `node` of leaf page `leaf_pgno` (its header now, or by the reader:
  // run_headers_); returns the value's file offset.
  uint64_t overflow(uint64_t pgno, uint64_t dsize, uint64_t leaf_pgno, uint64_t node, uint32_t* run_pages) {
    static_cast<void>(page(pgno, "overflow"));  // checks the page number
    const uint64_t needed = (kPageHeader - 1 + dsize) / psize_ + 1;  // LMDB's OVPAGES
    const RecordSpan span{pgno * psize_ + kPageHeader, static_cast<uint32_t>(dsize),
                          static_cast<uint32_t>(std::min<uint64_t>(needed, UINT32_MAX))};
    if (run_headers_ == RunHeaders::now && !run_header_ok(data_, span, static_cast<uint32_t>(psize_))) {
      fail(node_name(leaf_pgno, node) + ": " + run_header_problem(data_, span, static_cast<uint32_t>(psize_)));
    }
    uint64_t end = 0;
    if (needed > UINT32_MAX || !checked_add(pgno, needed, &end) || end - 1 > last_page_) {
      fail(node_name(leaf_pgno, node) + ": overflow run of " + std::to_string(needed) + " pages at page " +
           std::to_string(pgno) + " does not fit a " + std::to_string(dsize) + "-byte value inside the file");
    }
    for (uint64_t q = pgno; q < end; ++q) claim(q, "overflow");
    layout_.overflow_pages += needed;
    *run_pages = span.run_pages;
    return span.offset;
  }

  const uint8_t* data_;
  RunHeaders run_headers_;
  uint64_t size_;
  uint64_t expected_;
  const std::string& path_;
  uint64_t psize_ = 0;
  uint64_t last_page_ = 0;
  uint64_t next_key_ = 0;
  std::vector<uint8_t> used_;
  ShardLayout layout_;
};

}  // namespace

ShardLayout validate_lmdb(const uint8_t* data, uint64_t size, uint64_t expected_records, const std::string& path,
                          RunHeaders run_headers) {
  return Validator(data, size, expected_records, path, run_headers).run();
}

namespace {

// The one place that reads an overflow run's header (the 16 bytes before the
// value: validate_lmdb placed the run inside the file).
enum class RunFault { none, not_a_run, wrong_length };

RunFault run_fault(const uint8_t* data, const RecordSpan& span, uint32_t page_size) noexcept {
  if (span.run_pages == 0) return RunFault::none;
  const uint64_t start = span.offset - kPageHeader;
  const uint8_t* header = data + start;
  if (load<uint16_t>(header + 10) != kOverflow || load<uint64_t>(header) != start / page_size) {
    return RunFault::not_a_run;
  }
  return load<uint32_t>(header + 12) == span.run_pages ? RunFault::none : RunFault::wrong_length;
}

}  // namespace

bool run_header_ok(const uint8_t* data, const RecordSpan& span, uint32_t page_size) noexcept {
  return run_fault(data, span, page_size) == RunFault::none;
}

std::string run_header_problem(const uint8_t* data, const RecordSpan& span, uint32_t page_size) {
  const uint64_t pgno = (span.offset - kPageHeader) / page_size;
  switch (run_fault(data, span, page_size)) {
    case RunFault::none:
      return {};
    case RunFault::not_a_run:
      return "page " + std::to_string(pgno) + " is not the start of an overflow run";
    case RunFault::wrong_length:
      break;
  }
  return "overflow run of " + std::to_string(load<uint32_t>(data + (span.offset - kPageHeader) + 12)) +
         " pages at page " + std::to_string(pgno) + " does not fit a " + std::to_string(span.size) +
         "-byte value inside the file";
}

}  // namespace fastload
