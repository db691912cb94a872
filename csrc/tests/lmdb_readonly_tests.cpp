// LMDB itself on shard files, as py-lmdb opens them to read (ShardDataset,
// `fastload verify`): MDB_RDONLY | MDB_NOLOCK | MDB_NOSUBDIR, map size = file
// size. The point is Windows, where LMDB maps files with CreateFileMapping and
// grows a file opened for writing to its map size: a read-only open must not
// change the file (size, modification time, no lock file) and must work on a
// file with the read-only attribute and a non-ASCII path. Every value LMDB
// returns (a v4 block) must hold the records the native reader finds (ShardFile).
// A writable open of a copy is the contrast: on Windows it grows the file, so
// the size check can fail.
//
// Built only with FASTLOAD_THIRD_PARTY_FROM_SOURCE (liblmdb from the pinned
// py-lmdb sdist, cmake/third_party_windows.cmake); run under Wine by
// `make test-windows-core`. Usage: lmdb_readonly_tests DIR (as shard_tests).
#include <lmdb.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "errors.h"
#include "format/record_blocks.h"
#include "reader/shard_reader.h"
#include "tests/check.h"

using namespace fastload;
namespace fs = std::filesystem;

namespace {

std::string utf8(const fs::path& p) {
  const auto s = p.u8string();
  return std::string(s.begin(), s.end());
}

// Opens `path` with LMDB (`flags` plus MDB_NOSUBDIR | MDB_NOLOCK) and returns
// every value in key order; an empty vector and a message when LMDB fails.
std::vector<std::string> read_with_lmdb(const std::string& path, unsigned flags, size_t map_size) {
  std::vector<std::string> values;
  MDB_env* env = nullptr;
  if (mdb_env_create(&env) != 0) return values;
  int rc = mdb_env_set_mapsize(env, map_size);
  if (rc == 0) rc = mdb_env_open(env, path.c_str(), flags | MDB_NOSUBDIR | MDB_NOLOCK | MDB_NORDAHEAD, 0644);
  MDB_txn* txn = nullptr;
  if (rc == 0) rc = mdb_txn_begin(env, nullptr, MDB_RDONLY, &txn);
  MDB_dbi dbi = 0;
  if (rc == 0) rc = mdb_dbi_open(txn, nullptr, 0, &dbi);
  MDB_cursor* cursor = nullptr;
  if (rc == 0) rc = mdb_cursor_open(txn, dbi, &cursor);
  if (rc == 0) {
    MDB_val key, value;
    while (mdb_cursor_get(cursor, &key, &value, MDB_NEXT) == 0) {
      values.emplace_back(static_cast<const char*>(value.mv_data), value.mv_size);
    }
    mdb_cursor_close(cursor);
  }
  if (txn != nullptr) mdb_txn_abort(txn);
  mdb_env_close(env);
  if (rc != 0) std::printf("lmdb: %s: %s\n", path.c_str(), mdb_strerror(rc));
  return values;
}

void check_shard(const fs::path& file, uint64_t records) {
  const std::string path = utf8(file);
  const uintmax_t size = fs::file_size(file);
  const auto mtime = fs::last_write_time(file);
  const std::vector<std::string> values = read_with_lmdb(path, MDB_RDONLY, static_cast<size_t>(size));
  CHECK(!values.empty());
  // Format v4: each value is a block of records (docs/FORMAT.md); the records it holds, in key order,
  // must be the bytes the native reader finds.
  const ShardFile native(path, records, true);
  CHECK(native.records() == records);
  uint64_t key = 0, same = 0;
  for (const std::string& block : values) {
    if (block.size() < kBlockHeaderBytes) break;
    uint32_t count = 0, common = 0;
    std::memcpy(&count, block.data() + 16, 4);
    std::memcpy(&common, block.data() + 20, 4);
    const uint8_t width = static_cast<uint8_t>(block[6]);
    size_t at = kBlockHeaderBytes + size_t{width} * count;
    for (uint32_t i = 0; i < count && key < native.records(); ++i, ++key) {
      uint32_t length = common;
      if (width == 2) {
        uint16_t l16 = 0;
        std::memcpy(&l16, block.data() + kBlockHeaderBytes + 2 * size_t{i}, 2);
        length = l16;
      } else if (width == 4) {
        std::memcpy(&length, block.data() + kBlockHeaderBytes + 4 * size_t{i}, 4);
      }
      const auto [bytes, n] = native.record(key);
      same += at + length <= block.size() && n == length && std::memcmp(block.data() + at, bytes, n) == 0;
      at += length;
    }
  }
  CHECK(same == records);
  CHECK(fs::file_size(file) == size);
  CHECK(fs::last_write_time(file) == mtime);
  CHECK(!fs::exists(fs::u8path(path + "-lock")));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: lmdb_readonly_tests DIR (written by scripts/cross_test_shards.py)\n");
    return 2;
  }
  const fs::path dir = fs::u8path(argv[1]);
  const fs::path scratch = dir / fs::u8path(u8"lmdb scratch \u00e9\u6570");
  try {
    fs::remove_all(scratch);
    fs::create_directories(scratch);
    const uint64_t counts[] = {128, 128, 44};
    for (int s = 0; s < 3; ++s) {
      char name[32];
      std::snprintf(name, sizeof name, "shard-%05d.lmdb", s);
      check_shard(dir / "dataset" / name, counts[s]);
      // A copy with the read-only attribute, under a non-ASCII directory.
      const fs::path copy = scratch / name;
      fs::copy_file(dir / "dataset" / name, copy);
      fs::permissions(copy, fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                      fs::perm_options::remove);
      check_shard(copy, counts[s]);
      fs::permissions(copy, fs::perms::owner_write, fs::perm_options::add);
    }
    // The contrast: opened for writing with a larger map, the file grows on
    // Windows (LMDB sets its end to the map size); on POSIX it does not.
    const fs::path writable = scratch / "writable.lmdb";
    fs::copy_file(dir / "dataset" / "shard-00002.lmdb", writable);
    const uintmax_t before = fs::file_size(writable);
    const size_t blocks = read_with_lmdb(utf8(writable), MDB_RDONLY, static_cast<size_t>(before)).size();
    CHECK(blocks > 0 && read_with_lmdb(utf8(writable), 0, static_cast<size_t>(before) * 4).size() == blocks);
#ifdef _WIN32
    CHECK(fs::file_size(writable) == before * 4);
#else
    CHECK(fs::file_size(writable) == before);
#endif
  } catch (const std::exception& e) {
    test::unexpected(e);
  }
  fs::remove_all(scratch);
  return test::report("lmdb_readonly_tests");
}
