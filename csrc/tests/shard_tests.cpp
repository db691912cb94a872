// Tests of the core on real shard files written by the Python writer
// (scripts/cross_test_shards.py, whose layout and values this file
// recomputes): a threaded read of every sample, the epoch order against the
// Python one, damaged copies (truncations, byte flips), and what the file
// system may do to a shard: a read-only file, a path with non-ASCII
// characters, its size and modification time after reading. On Windows also
// backslash and drive-letter paths and a file another process holds open.
// Built for Linux (`make test-cpp`, under ASan+UBSan) and for Windows
// (`make test-windows-core`, mingw-w64, run under Wine).
//
// Also the png, lz4-shuffle and jpeg payloads the Python writer made
// (DIR/codecs), decoded by this build's libspng, liblz4 and TurboJPEG.
//
// Usage: shard_tests DIR, where DIR holds dataset/, order.txt, codecs/ and
// codecs-photo.bin.
#ifdef __linux__
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#endif
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "errors.h"
#include "platform/file_mapping.h"
#include "reader/batch_reader.h"
#include "reader/permutation.h"
#include "reader/rank_plan.h"
#include "reader/shard_reader.h"
#include "reader/warmer.h"
#include "tests/check.h"

#ifdef _WIN32
#ifndef NOMINMAX
#define NOMINMAX
#endif
#include <windows.h>

#endif
#include "platform/platform.h"

using namespace fastload;
namespace fs = std::filesystem;

namespace {

// The dataset of scripts/cross_test_shards.py.
constexpr uint64_t kSamples = 300;
constexpr uint64_t kPerShard = 128;
constexpr uint64_t kImageElems = 3 * 32 * 32;
const std::vector<FieldSpec> kFields = {FieldSpec{Codec::kZstdShuffle, 2, kImageElems * 2},
                                        FieldSpec{Codec::kRaw, 8, 8}};

uint16_t pixel(uint64_t i, uint64_t j) { return static_cast<uint16_t>(i * 2654435761ull + j * 40503ull); }

// The UTF-8 form of a path (std::filesystem's native form is UTF-16 on Windows).
std::string utf8(const fs::path& p) {
  const auto s = p.u8string();
  return std::string(s.begin(), s.end());
}

fs::path from_utf8(const std::string& s) { return fs::u8path(s); }

std::vector<std::string> shard_paths(const fs::path& dataset) {
  std::vector<std::string> paths;
  for (int s = 0; s < 3; ++s) {
    char name[32];
    std::snprintf(name, sizeof name, "shard-%05d.lmdb", s);
    paths.push_back(utf8(dataset / name));
  }
  return paths;
}

std::vector<uint64_t> shard_counts() { return {kPerShard, kPerShard, kSamples - 2 * kPerShard}; }

// The datasets of scripts/cross_test_shards.py are format v4: every shard holds blocks of records.
std::vector<bool> packed(size_t shards = 3) { return std::vector<bool>(shards, true); }

// True when sample `i`'s decoded image and label are the expected values.
bool sample_ok(uint64_t i, const uint8_t* image, const uint8_t* label) {
  for (uint64_t j = 0; j < kImageElems; ++j) {
    uint16_t v;
    std::memcpy(&v, image + 2 * j, 2);
    if (v != pixel(i, j)) return false;
  }
  int64_t l;
  std::memcpy(&l, label, 8);
  return l == static_cast<int64_t>(3 * i + 1);
}

// Per shard, the binding fingerprint its (format v3) records were written
// with: the test has no manifest, so it takes each shard's first record's
// (docs/FORMAT.md).
std::vector<uint64_t> written_fingerprints(const ShardSet& shards) {
  std::vector<uint64_t> out;
  for (size_t s = 0; s < shards.size(); ++s) {
    uint64_t fingerprint = 0;
    const auto [bytes, size] = shards.shard(s).record(0);
    for (size_t i = 0; i < 8 && size >= 24; ++i) fingerprint |= static_cast<uint64_t>(bytes[16 + i]) << (8 * i);
    out.push_back(fingerprint);
  }
  return out;
}

// Reader options for `shards` (their records' fingerprints), batches of `capacity`, `threads` workers.
ReaderOptions reader_options(const ShardSet& shards, size_t capacity, size_t threads) {
  ReaderOptions options;
  options.batch_capacity = capacity;
  options.num_threads = threads;
  options.shard_fingerprints = written_fingerprints(shards);
  return options;
}

// Whether `call()` throws FastloadError (a refusal); false when it returns.
template <typename Call>
bool refuses(Call&& call) {
  try {
    call();
  } catch (const FastloadError&) {
    return true;
  }
  return false;
}

// Decodes every record of `shards` in one thread; returns how many match.
uint64_t count_good_samples(const ShardSet& shards) {
  const std::vector<uint64_t> fingerprints = written_fingerprints(shards);
  RecordDecoder decoder(kFields, DecoderOptions{true, kDefaultMaxSampleBytes, kRecordVersion, 0});
  std::vector<uint8_t> image(kImageElems * 2), label(8);
  uint8_t* dest[] = {image.data(), label.data()};
  uint64_t good = 0;
  for (uint64_t i = 0; i < shards.total_records(); ++i) {
    const auto [s, key] = shards.locate(i);
    const auto [bytes, size] = shards.shard(s).record(key);
    decoder.decode(bytes, size, dest, key, fingerprints[s]);
    good += sample_ok(i, image.data(), label.data());
  }
  return good;
}

// Every sample read by `threads` threads in the epoch order of `order`, checked value by value; at most
// `max_running` of them (0: all) decoding at once, each record read `delay_us` late.
#ifdef __linux__
// thread_disk_faults counts the calling thread's page faults that read from disk: a file written, synced and
// dropped from the page cache, then read through a mapping, page by page.
void test_thread_disk_faults(const fs::path& scratch) {
  const fs::path path = scratch / "cold.bin";
  const size_t size = 4u << 20;
  {
    std::ofstream out(path, std::ios::binary);
    const std::vector<char> bytes(size, 7);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  CHECK(fd >= 0);
  if (fd < 0) return;
  CHECK(::fsync(fd) == 0);
  CHECK(::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED) == 0);
  void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  CHECK(map != MAP_FAILED);
  if (map != MAP_FAILED) {
    CHECK(::madvise(map, size, MADV_RANDOM) == 0);  // no read-ahead: one read per page touched
    std::vector<unsigned char> resident(size / 4096);
    if (::mincore(map, size, resident.data()) == 0 &&
        std::any_of(resident.begin(), resident.end(), [](unsigned char r) { return (r & 1) != 0; })) {
      // A file system whose pages are its storage (tmpfs) keeps them: nothing is read from a disk.
      std::printf("test_thread_disk_faults: skipped, %s stays in memory after POSIX_FADV_DONTNEED\n",
                  path.c_str());
      ::munmap(map, size);
      ::close(fd);
      return;
    }
    const std::optional<uint64_t> before = thread_disk_faults();
    CHECK(before.has_value());
    uint64_t sum = 0;
    for (size_t off = 0; off < size; off += 4096) sum += static_cast<const volatile uint8_t*>(map)[off];
    const std::optional<uint64_t> after = thread_disk_faults();
    CHECK(sum == 7u * (size / 4096));
    CHECK(after.has_value() && before.has_value() && *after > *before);
    ::munmap(map, size);
  }
  ::close(fd);
  std::thread([] { CHECK(thread_disk_faults().value_or(1) == 0); }).join();  // another thread: its own count
}
#endif

void test_threaded_read(const fs::path& dataset, const std::vector<uint64_t>& order, size_t threads = 4,
                        size_t max_running = 0, uint32_t delay_us = 0) {
  auto shards = std::make_shared<const ShardSet>(shard_paths(dataset), shard_counts(), packed());
  CHECK(shards->total_records() == kSamples);
  ReaderOptions options;
  options.batch_capacity = 32;
  options.num_threads = threads;
  options.max_running = max_running;
  options.shard_fingerprints = written_fingerprints(*shards);
  BatchReader reader(shards, kFields, options);
  const size_t turns = max_running == 0 ? threads : std::min(max_running, threads);
  CHECK(reader.num_threads() == threads && reader.max_running() == turns);
  reader.set_read_delay_for_tests(delay_us);
  std::vector<std::vector<uint8_t>> memory(3, std::vector<uint8_t>(reader.slot_bytes()));
  for (auto& m : memory) reader.pool()->add(m.data(), m.size(), nullptr);
  std::vector<bool> seen(kSamples, false);
  uint64_t good = 0, delivered = 0;
  size_t next = 0;
  std::vector<std::vector<uint64_t>> submitted;
  auto submit_one = [&] {
    std::vector<uint64_t> batch(order.begin() + static_cast<long>(next),
                                order.begin() + static_cast<long>(std::min<size_t>(next + 32, order.size())));
    next += batch.size();
    submitted.push_back(batch);
    reader.submit(std::move(batch));
  };
  for (int k = 0; k < 2 && next < order.size(); ++k) submit_one();
  size_t done = 0;
  while (done < submitted.size()) {
    auto batch = reader.wait_next(std::chrono::milliseconds(60000));
    CHECK(batch.has_value());
    if (!batch) break;
    const auto& indices = submitted[done++];
    CHECK(batch->count == indices.size());
    for (size_t k = 0; k < batch->count; ++k) {
      const uint8_t* image = batch->slot->data + reader.field_offset(0) + k * kFields[0].decoded_bytes;
      const uint8_t* label = batch->slot->data + reader.field_offset(1) + k * kFields[1].decoded_bytes;
      good += sample_ok(indices[k], image, label);
      seen[indices[k]] = true;
      ++delivered;
    }
    batch.reset();  // the slot goes back to the pool
    if (next < order.size()) submit_one();
  }
  CHECK(delivered == kSamples);
  CHECK(good == kSamples);
  CHECK(std::count(seen.begin(), seen.end(), true) == static_cast<long>(kSamples));
  CHECK(reader.stats().samples == kSamples);
  // Never more at once than the turns; with slow reads and two batches submitted together, exactly that many
  // (the second submit wakes a second worker while the first still reads).
  CHECK(reader.stats().peak_running <= turns);
  if (delay_us > 0) CHECK(reader.stats().peak_running == std::min<size_t>(turns, 2));
}

// Batches planned ahead (BatchReader::plan): the reader submits them itself,
// in order, no more than the window (the first window until the first batch
// is out), each when a slot is free. Planned by position of the epoch order
// of DIR/order.txt, the workers map the positions: every sample arrives in
// that order. Planned by index, the same. Bad plans are refused whole.
void test_planned_read(const fs::path& dir, const std::vector<uint64_t>& order) {
  std::ifstream in(dir / "order.txt");
  uint64_t seed = 0, epoch = 0, n = 0;
  in >> seed >> epoch >> n;
  auto shards = std::make_shared<const ShardSet>(shard_paths(dir / "dataset"), shard_counts(), packed());
  for (const bool by_position : {true, false}) {
    BatchReader reader(shards, kFields, reader_options(*shards, 32, 3));
    reader.set_window(4, 2);
    std::vector<uint64_t> values(n);
    for (uint64_t k = 0; k < n; ++k) values[k] = by_position ? k : order[k];
    std::vector<size_t> sizes;
    for (uint64_t left = n; left > 0; left -= std::min<uint64_t>(left, 32)) sizes.push_back(std::min<uint64_t>(left, 32));
    const auto permutation = by_position ? std::make_shared<const Permutation>(seed, epoch, n) : nullptr;
    // In two stretches, the second planned while batches of the first are in flight.
    const size_t half = sizes.size() / 2;
    const std::vector<size_t> first_sizes(sizes.begin(), sizes.begin() + static_cast<long>(half));
    const std::vector<size_t> second_sizes(sizes.begin() + static_cast<long>(half), sizes.end());
    const size_t split = half * 32;
    reader.plan(std::vector<uint64_t>(values.begin(), values.begin() + static_cast<long>(split)), first_sizes, {},
                permutation);
    CHECK(reader.slots_wanted() == 2);  // the first window, no slot yet
    bool refused = false;
    try {
      reader.wait_next(std::chrono::milliseconds(10));
    } catch (const FastloadError& e) {
      refused = std::string(e.what()).find("no free batch buffer") != std::string::npos;
    }
    CHECK(refused);
    std::vector<std::vector<uint8_t>> memory;
    auto add_wanted = [&] {
      for (size_t k = reader.slots_wanted(); k > 0; --k) {
        memory.emplace_back(reader.slot_bytes());
        reader.pool()->add(memory.back().data(), memory.back().size(), nullptr);
      }
    };
    uint64_t good = 0, position = 0;
    size_t batches = 0;
    bool second_planned = false;
    while (position < n) {
      add_wanted();
      CHECK(reader.pending() <= (batches == 0 ? 2u : 4u));
      auto batch = reader.wait_next(std::chrono::milliseconds(60000));
      CHECK(batch.has_value());
      if (!batch) break;
      CHECK(batch->count == sizes[batches]);
      for (size_t k = 0; k < batch->count; ++k, ++position) {
        const uint8_t* image = batch->slot->data + reader.field_offset(0) + k * kFields[0].decoded_bytes;
        const uint8_t* label = batch->slot->data + reader.field_offset(1) + k * kFields[1].decoded_bytes;
        good += sample_ok(order[position], image, label);
      }
      ++batches;
      if (!second_planned) {
        reader.plan(std::vector<uint64_t>(values.begin() + static_cast<long>(split), values.end()), second_sizes, {},
                    permutation);
        second_planned = true;
      }
    }
    CHECK(good == n);
    CHECK(batches == sizes.size() && reader.planned() == 0 && reader.pending() == 0);
    CHECK(memory.size() <= 5);  // the window and the batch the consumer held
    // Refused whole: sizes that do not add up, an empty batch, an index or position out of range, and
    // submit() while planned batches wait.
    CHECK(refuses([&] { reader.plan({0, 1, 2}, {2}, {}, permutation); }));
    CHECK(refuses([&] { reader.plan({0, 1}, {0, 2}, {}, permutation); }));
    CHECK(refuses([&] { reader.plan({0, 1}, {33}, {}, permutation); }));
    CHECK(refuses([&] { reader.plan({0, kSamples}, {2}, {}, permutation); }));
    CHECK(refuses([&] { reader.plan({0}, {1}, {}, std::make_shared<const Permutation>(seed, epoch, kSamples + 1)); }));
    CHECK(reader.planned() == 0);
    reader.plan({0, 1, 2, 3, 4, 5, 6, 7}, std::vector<size_t>(8, 1), {}, permutation);  // 4 wait for the window
    CHECK(reader.planned() == 4);
    CHECK(refuses([&] { reader.submit({0}); }));
    reader.close();  // its workers are joined before `memory`, which they may still be writing, is freed
  }
  // close() right after a batch arrives (a `break`): a worker on its way to idle must not start a
  // planned batch close() would not drop, which kept its slot out of the pool until the reader was
  // destroyed (found by review: 135 of 2,000 closes before the fix).
  int stuck = 0;
  for (int run = 0; run < 300; ++run) {
    ReaderOptions close_options;
    close_options.batch_capacity = 4;
    close_options.num_threads = 3;
    close_options.shard_fingerprints = written_fingerprints(*shards);
    std::vector<std::vector<uint8_t>> memory(3);
    BatchReader reader(shards, kFields, close_options);
    reader.set_window(3, 3);
    std::vector<uint64_t> first(64);
    for (size_t i = 0; i < first.size(); ++i) first[i] = i;
    reader.plan(first, std::vector<size_t>(16, 4));
    for (auto& m : memory) {
      m.resize(reader.slot_bytes());
      reader.pool()->add(m.data(), m.size(), nullptr);
    }
    reader.wait_next(std::chrono::milliseconds(60000)).reset();
    reader.close();
    stuck += reader.pool()->free_count() != reader.pool()->total_count();
  }
  CHECK(stuck == 0);
  // A lazy set's batches are planned only once every shard is attached (a
  // cache holding the whole dataset); each shard then stays attached until
  // the plan's batches are delivered.
  ReaderOptions options;
  options.batch_capacity = 4;
  options.shard_fingerprints = written_fingerprints(*shards);
  const auto paths = shard_paths(dir / "dataset");
  auto lazy = std::make_shared<ShardSet>(shard_counts(), packed());
  for (size_t i = 0; i + 1 < paths.size(); ++i) lazy->attach(i, paths[i]);
  BatchReader lazy_reader(lazy, kFields, options);
  bool refused = false;
  try {
    lazy_reader.plan({0}, {1});
  } catch (const FastloadError&) {
    refused = true;
  }
  CHECK(refused && lazy_reader.planned() == 0);
  CHECK(lazy->detach(0));  // the refused plan pinned nothing
  lazy->attach(0, paths[0]);
  lazy->attach(paths.size() - 1, paths.back());
  const size_t last = paths.size() - 1;
  lazy_reader.plan({0, last * kPerShard, 1, last * kPerShard + 1}, {2, 2});
  CHECK(!lazy->detach(0) && !lazy->detach(1));  // a shard no batch reads stays too: the plan holds all
  std::vector<std::vector<uint8_t>> lazy_memory(2, std::vector<uint8_t>(lazy_reader.slot_bytes()));
  for (auto& m : lazy_memory) lazy_reader.pool()->add(m.data(), m.size(), nullptr);
  for (int b = 0; b < 2; ++b) {
    std::optional<CompletedBatch> batch = lazy_reader.wait_next(std::chrono::milliseconds(60000));
    CHECK(batch.has_value() && batch->count == 2);
    if (b == 0) CHECK(!lazy->detach(1));  // still held while a batch of the plan is to come
    batch.reset();
  }
  CHECK(lazy->detach(1) && lazy->detach(0));  // every batch delivered: the plan let go
  lazy_reader.close();
}

// Batches of a RankPlan (BatchReader::plan_positions): the reader works out
// each batch's positions as _plan.py's EpochPlan does, for every rank of a
// world, a resumed start, the identity and the epoch order; a consumer that
// waits (a window of 8: it sleeps until 4 batches are ready) still gets every
// batch in order. Bad plans are refused whole; plan(), plan_positions() and
// submit() do not mix while batches remain.
void test_rank_plan_read(const fs::path& dir, const std::vector<uint64_t>& order) {
  std::ifstream in(dir / "order.txt");
  uint64_t seed = 0, epoch = 0, n = 0;
  in >> seed >> epoch >> n;
  auto shards = std::make_shared<const ShardSet>(shard_paths(dir / "dataset"), shard_counts(), packed());
  CHECK(refuses([] { RankPlan(0, 10, 0, 0, 10, 4); }));   // world_size 0
  CHECK(refuses([] { RankPlan(0, 10, 3, 3, 4, 4); }));    // rank outside the world
  CHECK(refuses([] { RankPlan(0, 10, 0, 1, 10, 0); }));   // batch_size 0
  CHECK(refuses([] { RankPlan(0, 0, 0, 1, 1, 4); }));     // samples from no positions
  CHECK(refuses([] { RankPlan(~0ull, 2, 0, 1, 1, 4); }));  // start + remaining wraps
  CHECK(refuses([] { RankPlan(0, 10, 1, 2, ~0ull / 2 + 2, 4); }));  // the last offset wraps
  CHECK(RankPlan(0, 10, 0, 1, 0, 4).batch_count() == 0);
  const RankPlan sample(7, 293, 1, 3, 98, 32);  // 293 positions from 7 over 3 ranks, even: 98 each (padded)
  CHECK(sample.batch_count() == 4 && sample.batch_samples(3) == 2 && sample.end() == 300);
  CHECK(sample.positions(3) == (std::vector<uint64_t>{7 + (1 + 96 * 3) % 293, 7 + (1 + 97 * 3) % 293}));

  struct Case {
    uint64_t start, world, rank, samples;
    size_t first;
    bool by_position;
  };
  const uint64_t world = 3, start = 7, remaining = kSamples - start;
  std::vector<Case> cases;
  for (uint64_t rank = 0; rank < world; ++rank) {
    cases.push_back({start, world, rank, (remaining + world - 1) / world, 0, true});  // even, padded
    cases.push_back({start, world, rank, (remaining - rank + world - 1) / world, 0, false});  // not padded
  }
  cases.push_back({0, 1, 0, kSamples, 3, true});  // resumed at batch 3
  for (const Case& c : cases) {
    BatchReader reader(shards, kFields, reader_options(*shards, 16, 3));
    reader.set_window(8, 2);
    const RankPlan plan(c.start, kSamples - c.start, c.rank, c.world, c.samples, 16);
    const auto permutation = c.by_position ? std::make_shared<const Permutation>(seed, epoch, n) : nullptr;
    reader.plan_positions(plan, c.first, plan.batch_count(), permutation);
    CHECK(reader.planned() == plan.batch_count() - c.first);  // no slot yet: none submitted
    CHECK(refuses([&] { reader.plan({0}, {1}); }));   // a RankPlan's batches remain
    CHECK(refuses([&] { reader.submit({0}); }));
    CHECK(refuses([&] { reader.plan_positions(plan, 0, 1); }));
    std::vector<std::vector<uint8_t>> memory;
    uint64_t good = 0, expected = 0;
    for (size_t b = c.first; b < plan.batch_count(); ++b) {
      for (size_t k = reader.slots_wanted(); k > 0; --k) {
        memory.emplace_back(reader.slot_bytes());
        reader.pool()->add(memory.back().data(), memory.back().size(), nullptr);
      }
      auto batch = reader.wait_next(std::chrono::milliseconds(60000));
      CHECK(batch.has_value());
      if (!batch) break;
      const std::vector<uint64_t> positions = plan.positions(b);
      CHECK(batch->count == positions.size());
      for (size_t k = 0; k < batch->count; ++k, ++expected) {
        const uint64_t j = b * 16 + k;  // the formula of _plan.py, written out
        CHECK(positions[k] == c.start + (c.rank + j * c.world) % (kSamples - c.start));
        const uint64_t index = c.by_position ? order[positions[k]] : positions[k];
        const uint8_t* image = batch->slot->data + reader.field_offset(0) + k * kFields[0].decoded_bytes;
        const uint8_t* label = batch->slot->data + reader.field_offset(1) + k * kFields[1].decoded_bytes;
        good += sample_ok(index, image, label);
      }
    }
    CHECK(expected == c.samples - std::min<uint64_t>(c.samples, c.first * 16) && good == expected);
    CHECK(reader.planned() == 0 && reader.pending() == 0);
    CHECK(memory.size() <= 10);  // the window, the batch the consumer held, and one more at most
    // Spent: a new plan may follow; refused whole when out of range.
    CHECK(refuses([&] { reader.plan_positions(plan, 0, plan.batch_count() + 1, permutation); }));
    CHECK(refuses([&] { reader.plan_positions(RankPlan(0, kSamples + 1, 0, 1, kSamples + 1, 16), 0, 1); }));
    CHECK(refuses([&] { reader.plan_positions(RankPlan(0, 10, 0, 1, 10, 17), 0, 1); }));  // over the capacity
    CHECK(refuses([&] {
      reader.plan_positions(plan, 0, 1, std::make_shared<const Permutation>(seed, epoch, kSamples + 1));
    }));
    CHECK(reader.planned() == 0);
    reader.plan(std::vector<uint64_t>(20, 0), std::vector<size_t>(20, 1));  // more than the window of 8
    CHECK(reader.planned() >= 12);
    CHECK(refuses([&] { reader.plan_positions(plan, 0, 1); }));  // plan()'s batches remain
    reader.close();
  }
  // A lazy set: refused until every shard is attached, as plan().
  ReaderOptions options;
  options.batch_capacity = 4;
  options.shard_fingerprints = written_fingerprints(*shards);
  const auto paths = shard_paths(dir / "dataset");
  auto lazy = std::make_shared<ShardSet>(shard_counts(), packed());
  lazy->attach(0, paths[0]);
  BatchReader lazy_reader(lazy, kFields, options);
  CHECK(refuses([&] { lazy_reader.plan_positions(RankPlan(0, 4, 0, 1, 4, 4), 0, 1); }));
  CHECK(lazy->detach(0));  // the refused plan pinned nothing
  lazy_reader.close();
}

// A consumer that has to wait sleeps until three quarters of the window are
// ready (one wake per several batches, not per batch): after the first batch
// (which wakes it at once), each wait_next() that found its batch unfinished
// returns with the next five of a window of 8 ready too, and nothing is lost.
void test_consumer_waits_for_most_of_the_window(const fs::path& dataset) {
  auto shards = std::make_shared<const ShardSet>(shard_paths(dataset), shard_counts(), packed());
  BatchReader reader(shards, kFields, reader_options(*shards, 4, 1));  // 1 thread: batches finish in order
  reader.set_window(8, 8);
  std::vector<std::vector<uint8_t>> memory(10, std::vector<uint8_t>(reader.slot_bytes()));
  for (auto& m : memory) reader.pool()->add(m.data(), m.size(), nullptr);
  reader.set_read_delay_for_tests(2000);  // 8 ms a batch
  const RankPlan plan(0, kSamples, 0, 1, 24 * 4, 4);
  reader.plan_positions(plan, 0, plan.batch_count());
  reader.wait_next(std::chrono::milliseconds(60000)).reset();  // the first: as soon as it is ready
  size_t waited = 0;
  for (size_t b = 1; b < plan.batch_count(); ++b) {
    const bool was_ready = reader.ready() > 0;
    auto batch = reader.wait_next(std::chrono::milliseconds(60000));
    CHECK(batch.has_value() && batch->count == 4);
    if (!was_ready) {
      ++waited;
      CHECK(reader.ready() + 1 >= std::min<size_t>(6, plan.batch_count() - b));  // it and the next 5
    }
  }
  CHECK(waited >= 2 && waited <= 8);  // woken about once per 6 batches of 23 (about 4), not per batch
  reader.close();
}

// wait_next(0) takes a batch already complete and returns nullopt at once for
// one still being read (the binding's take with the GIL held), losing nothing.
void test_wait_next_without_a_wait(const fs::path& dataset) {
  auto shards = std::make_shared<const ShardSet>(shard_paths(dataset), shard_counts(), packed());
  BatchReader reader(shards, kFields, reader_options(*shards, 4, 1));
  reader.set_window(2, 2);
  std::vector<std::vector<uint8_t>> memory(3, std::vector<uint8_t>(reader.slot_bytes()));
  for (auto& m : memory) reader.pool()->add(m.data(), m.size(), nullptr);
  reader.set_read_delay_for_tests(50000);  // 200 ms a batch: the first try comes long before it is ready
  const RankPlan plan(0, kSamples, 0, 1, 3 * 4, 4);
  reader.plan_positions(plan, 0, plan.batch_count());
  const auto start = std::chrono::steady_clock::now();
  CHECK(!reader.wait_next(std::chrono::milliseconds(0)).has_value());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(150));  // no wait for it
  reader.set_read_delay_for_tests(0);
  size_t delivered = 0;
  while (delivered < plan.batch_count()) {
    while (!reader.next_ready()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    auto batch = reader.wait_next(std::chrono::milliseconds(0));
    CHECK(batch.has_value() && batch->count == 4);
    ++delivered;
  }
  reader.close();
}

// A lazy set: a record of a shard not attached is a FastloadError; shards
// attached from several threads at once (each twice) read as the eager set.
void test_lazy_attach(const fs::path& dataset) {
  const auto paths = shard_paths(dataset);
  ShardSet lazy(shard_counts(), packed());
  CHECK(lazy.size() == paths.size() && lazy.total_records() == kSamples && !lazy.attached(0));
  bool refused = false;
  try {
    lazy.shard(0);
  } catch (const FastloadError& e) {
    refused = std::string(e.what()).find("not fetched yet") != std::string::npos;
  }
  CHECK(refused);
  lazy.prefetch(0);  // ignored, no crash
  std::vector<std::thread> threads;
  for (int copy = 0; copy < 2; ++copy) {
    for (size_t i = 0; i < paths.size(); ++i) threads.emplace_back([&lazy, &paths, i] { lazy.attach(i, paths[i]); });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < paths.size(); ++i) CHECK(lazy.attached(i));
  CHECK(count_good_samples(lazy) == kSamples);
  bool out_of_range = false;
  try {
    lazy.attach(paths.size(), paths[0]);
  } catch (const FastloadError&) {
    out_of_range = true;
  }
  CHECK(out_of_range);
}

// A lazy set's shard is detached (closed) only when no batch in flight reads
// it: a submitted batch pins its shards until it is delivered; a batch over a
// detached shard is not queued (submit returns false) and reads again once the
// shard is attached again. Readers racing detach/attach never crash.
void test_detach_pinned(const fs::path& dataset) {
  const auto paths = shard_paths(dataset);
  auto lazy = std::make_shared<ShardSet>(shard_counts(), packed());
  CHECK(lazy->lazy() && !ShardSet(paths, shard_counts(), packed()).lazy());
  for (size_t i = 0; i < paths.size(); ++i) lazy->attach(i, paths[i]);
  ReaderOptions options;
  options.batch_capacity = 4;
  options.num_threads = 2;
  options.shard_fingerprints = written_fingerprints(ShardSet(paths, shard_counts(), packed()));
  BatchReader reader(lazy, kFields, options);
  std::vector<uint8_t> memory(reader.slot_bytes() * 2);
  reader.pool()->add(memory.data(), reader.slot_bytes(), nullptr);
  reader.pool()->add(memory.data() + reader.slot_bytes(), reader.slot_bytes(), nullptr);
  reader.set_read_delay_for_tests(20000);  // the batch stays in flight while detach is tried
  CHECK(reader.submit({0, 1, kPerShard, kPerShard + 1}));
  CHECK(!lazy->detach(0) && !lazy->detach(1) && lazy->attached(0));  // pinned by the batch in flight
  CHECK(lazy->detach(2) && !lazy->attached(2));                      // read by no batch
  CHECK(!reader.submit({2 * kPerShard}));                            // its shard is detached: not queued
  reader.set_read_delay_for_tests(0);
  CHECK(reader.wait_next(std::chrono::milliseconds(60000)).has_value());
  CHECK(lazy->detach(0) && !lazy->attached(0));  // delivered: unpinned
  lazy->attach(0, paths[0]);
  lazy->attach(2, paths[2]);
  CHECK(reader.submit({2 * kPerShard, 0}));
  CHECK(reader.wait_next(std::chrono::milliseconds(60000)).has_value());
  bool eager_refused = false;
  try {
    ShardSet(paths, shard_counts(), packed()).detach(0);
  } catch (const FastloadError&) {
    eager_refused = true;
  }
  CHECK(eager_refused);
  // Detach and attach again while batches over every shard come and go. After a racing pass the
  // churn waits until a submit has started, so that submits race attaching and detaching instead of
  // all landing inside a pass; after a quiet pass it waits until two submits have ended, the second
  // begun after the pass, so that such a submit finds every shard attached. A refused submit waits
  // for the pass in progress to end: under Wine, where attaching is slow, refused submits used up the
  // rounds within a few passes (CI: 0 to 9 batches of 300 delivered).
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> attempts{0};
  std::atomic<uint64_t> ended{0};
  std::atomic<uint64_t> passes{0};
  std::thread churn([&] {
    for (uint64_t pass = 0; !stop.load(); ++pass) {
      for (size_t i = 0; i < paths.size(); ++i) {
        if (lazy->detach(i)) lazy->attach(i, paths[i]);
      }
      passes.fetch_add(1);
      const bool quiet = pass % 2 == 1;
      const std::atomic<uint64_t>& counter = quiet ? ended : attempts;
      const uint64_t until = counter.load() + (quiet ? 2 : 1);
      while (counter.load() < until && !stop.load()) std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  });
  size_t delivered = 0;
  int rounds = 0;
  for (; rounds < 300; ++rounds) {
    const uint64_t a = static_cast<uint64_t>(rounds) % kSamples;
    const uint64_t pass = passes.load();  // read before the attempt: the churn may be waiting for it
    attempts.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(50 * (rounds % 4)));  // land early or late in a pass
    if (reader.submit({a, (a + kPerShard) % kSamples, (a + 2 * kPerShard) % kSamples})) {
      delivered += reader.wait_next(std::chrono::milliseconds(60000)).has_value() ? 1 : 0;
    } else {
      const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (passes.load() == pass && std::chrono::steady_clock::now() < give_up) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
    ended.fetch_add(1);
  }
  stop.store(true);
  churn.join();
  std::printf("shard_tests: %zu of %d batches delivered while shards were detached and attached\n", delivered,
              rounds);
  CHECK(delivered > 0);
}

// Format v3: shards 0 and 1 swapped (same record count, every record valid)
// are refused at their first record, as each shard's records carry its
// position; with the fingerprints in the swapped order they read again.
void test_swapped_shards_refused(const fs::path& dataset) {
  const auto paths = shard_paths(dataset);
  const auto expected = written_fingerprints(ShardSet(paths, shard_counts(), packed()));
  CHECK(expected[0] != expected[1]);
  auto swapped = std::make_shared<const ShardSet>(std::vector<std::string>{paths[1], paths[0], paths[2]},
                                                  shard_counts(), packed());
  for (bool fixed : {false, true}) {
    ReaderOptions options;
    options.batch_capacity = 4;
    options.num_threads = 2;
    options.shard_fingerprints = fixed ? std::vector<uint64_t>{expected[1], expected[0], expected[2]} : expected;
    BatchReader reader(swapped, kFields, options);
    std::vector<uint8_t> memory(reader.slot_bytes());
    reader.pool()->add(memory.data(), memory.size(), nullptr);
    reader.submit({kPerShard + 1, 2, 3, 4});
    bool refused = false;
    try {
      auto batch = reader.wait_next(std::chrono::milliseconds(60000));
      CHECK(batch.has_value());
    } catch (const CorruptRecordError& e) {
      refused = std::string(e.what()).find("for another shard position") != std::string::npos;
    }
    CHECK(refused == !fixed);
  }
  bool short_list = false;
  try {
    ReaderOptions options;
    options.shard_fingerprints = {expected[0]};
    BatchReader reader(swapped, kFields, options);
  } catch (const FastloadError& e) {
    short_list = std::string(e.what()).find("one binding fingerprint per shard") != std::string::npos;
  }
  CHECK(short_list);
}

// A reader given an earlier reader's pool takes its buffers (those still held
// by the consumer come back when released, and are not written before); a pool
// of another slot size is not taken.
void test_pool_carried_over(const fs::path& dataset) {
  auto shards = std::make_shared<const ShardSet>(shard_paths(dataset), shard_counts(), packed());
  ReaderOptions options;
  options.batch_capacity = 8;
  options.num_threads = 3;
  options.shard_fingerprints = written_fingerprints(*shards);
  std::vector<std::vector<uint8_t>> memory(2);
  std::shared_ptr<SlotPool> pool;
  std::optional<CompletedBatch> kept;
  std::vector<uint64_t> first = {5, 1, 4, 1, 5, 9, 2, 6};
  {
    BatchReader reader(shards, kFields, options);
    for (auto& m : memory) {
      m.resize(reader.slot_bytes());
      reader.pool()->add(m.data(), m.size(), nullptr);
    }
    reader.submit(first);
    kept = reader.wait_next(std::chrono::milliseconds(60000));
    CHECK(kept.has_value() && kept->count == first.size());
    pool = reader.pool();
  }  // the reader is gone; the consumer still holds one batch
  CHECK(pool->total_count() == 2 && pool->free_count() == 1);
  const std::vector<uint8_t> before(kept->slot->data, kept->slot->data + pool->slot_bytes());
  options.pool = pool;
  BatchReader next(shards, kFields, options);
  CHECK(next.pool() == pool);
  uint64_t good = 0;
  for (uint64_t round = 0; round < 3; ++round) {
    std::vector<uint64_t> indices;
    for (uint64_t k = 0; k < 8; ++k) indices.push_back((round * 8 + k * 7) % kSamples);
    next.submit(indices);
    auto batch = next.wait_next(std::chrono::milliseconds(60000));
    CHECK(batch.has_value() && batch->slot->data != kept->slot->data);
    for (size_t k = 0; batch && k < batch->count; ++k) {
      good += sample_ok(indices[k], batch->slot->data + next.field_offset(0) + k * kFields[0].decoded_bytes,
                        batch->slot->data + next.field_offset(1) + k * kFields[1].decoded_bytes);
    }
  }
  CHECK(good == 24);
  CHECK(std::equal(before.begin(), before.end(), kept->slot->data));  // the held batch was not written
  bool refused = false;
  next.submit({0});
  try {  // both buffers in use: no third one appears
    next.submit({1});
  } catch (const FastloadError&) {
    refused = true;
  }
  CHECK(refused);
  kept.reset();  // the held buffer returns to the pool the new reader uses
  CHECK(pool->free_count() == 1);
  next.submit({2});
  CHECK(next.wait_next(std::chrono::milliseconds(60000)).has_value());
  CHECK(next.wait_next(std::chrono::milliseconds(60000)).has_value());
  CHECK(pool->total_count() == 2 && pool->free_count() == 2);
  pool->keep_at_most(1);  // one free buffer is freed now
  CHECK(pool->total_count() == 1 && pool->free_count() == 1);
  next.submit({3});
  CHECK(next.wait_next(std::chrono::milliseconds(60000)).has_value());
  CHECK(pool->free_count() == 1);
  pool->keep_at_most(0);
  CHECK(pool->total_count() == 0);
  pool->add(memory[0].data(), memory[0].size(), nullptr);
  next.submit({4});
  CHECK(next.wait_next(std::chrono::milliseconds(60000)).has_value());
  CHECK(pool->total_count() == 0 && pool->free_count() == 0);  // a buffer coming back was freed, not kept
  options.batch_capacity = 16;  // another slot size: a pool of its own
  BatchReader other(shards, kFields, options);
  CHECK(other.pool() != pool && other.pool()->total_count() == 0);
}

// The C++ Permutation gives the order the Python writer's EpochOrder wrote.
std::vector<uint64_t> test_order(const fs::path& dir) {
  std::ifstream in(dir / "order.txt");
  uint64_t seed = 0, epoch = 0, n = 0;
  in >> seed >> epoch >> n;
  std::vector<uint64_t> expected(n);
  for (auto& x : expected) in >> x;
  CHECK(in.good() || in.eof());
  CHECK(n == kSamples);
  const Permutation p(seed, epoch, n);
  uint64_t same = 0;
  for (uint64_t k = 0; k < n; ++k) same += p(k) == expected[k];
  CHECK(same == n);
  return expected;
}

// DIR/codecs (scripts/cross_test_shards.py): png and lz4-shuffle fields equal
// the values written, the jpeg field equals the pure-Python reader's decode
// (the same TurboJPEG calls; libjpeg-turbo's C and SIMD paths give the same
// pixels), for every sample, read by 2 threads.
void test_codecs(const fs::path& dir) {
  constexpr uint64_t n = 40;
  const std::vector<FieldSpec> fields = {
      FieldSpec{Codec::kPng, 1, 3 * 16 * 16, false, ImageGeometry{16, 16, 3, true}},
      FieldSpec{Codec::kPng, 2, 16 * 16 * 2, false, ImageGeometry{16, 16, 1, false}},
      FieldSpec{Codec::kLz4Shuffle, 2, 5 * 8 * 8 * 2},
      FieldSpec{Codec::kJpeg, 1, 3 * 16 * 16, false, ImageGeometry{16, 16, 3, true}}};
  std::ifstream in(dir / "codecs-photo.bin", std::ios::binary);
  std::vector<uint8_t> photo(n * fields[3].decoded_bytes);
  in.read(reinterpret_cast<char*>(photo.data()), static_cast<std::streamsize>(photo.size()));
  CHECK(in.gcount() == static_cast<std::streamsize>(photo.size()));
  auto shards = std::make_shared<const ShardSet>(std::vector<std::string>{utf8(dir / "codecs" / "shard-00000.lmdb")},
                                                 std::vector<uint64_t>{n}, packed(1));
  ReaderOptions options;
  options.batch_capacity = n;
  options.num_threads = 2;
  options.shard_fingerprints = written_fingerprints(*shards);
  BatchReader reader(shards, fields, options);
  std::vector<uint8_t> memory(reader.slot_bytes());
  reader.pool()->add(memory.data(), memory.size(), nullptr);
  std::vector<uint64_t> all(n);
  for (uint64_t i = 0; i < n; ++i) all[i] = i;
  reader.submit(all);
  auto batch = reader.wait_next(std::chrono::milliseconds(60000));
  CHECK(batch.has_value() && batch->count == n);
  if (!batch || batch->count != n) return;
  uint64_t good[4] = {0, 0, 0, 0};
  for (uint64_t i = 0; i < n; ++i) {
    const uint8_t* rgb = batch->slot->data + reader.field_offset(0) + i * fields[0].decoded_bytes;
    const uint8_t* depth = batch->slot->data + reader.field_offset(1) + i * fields[1].decoded_bytes;
    const uint8_t* bands = batch->slot->data + reader.field_offset(2) + i * fields[2].decoded_bytes;
    const uint8_t* jpeg = batch->slot->data + reader.field_offset(3) + i * fields[3].decoded_bytes;
    bool ok = true;
    for (uint64_t j = 0; j < 768; ++j) ok = ok && rgb[j] == static_cast<uint8_t>(7 * i + 13 * j);
    good[0] += ok;
    ok = true;
    for (uint64_t j = 0; j < 256; ++j) {
      uint16_t v;
      std::memcpy(&v, depth + 2 * j, 2);
      ok = ok && v == pixel(i, j);
    }
    good[1] += ok;
    ok = true;
    for (uint64_t j = 0; j < 320; ++j) {
      uint16_t v;
      std::memcpy(&v, bands + 2 * j, 2);
      ok = ok && v == static_cast<uint16_t>((31 * i + 977 * j) % 4096);
    }
    good[2] += ok;
    good[3] += std::memcmp(jpeg, photo.data() + i * fields[3].decoded_bytes, fields[3].decoded_bytes) == 0;
  }
  for (uint64_t g : good) CHECK(g == n);
}

fs::path copy_dataset(const fs::path& from, const fs::path& to) {
  fs::remove_all(to);
  fs::create_directories(to);
  for (const auto& e : fs::directory_iterator(from)) fs::copy_file(e.path(), to / e.path().filename());
  return to;
}

// Truncations anywhere and byte flips in the tree pages must end in an error,
// never in a wrong sample.
void test_damaged_copies(const fs::path& dataset, const fs::path& scratch) {
  const std::string first = shard_paths(dataset)[0];
  std::vector<uint8_t> bytes;
  {
    std::ifstream in(from_utf8(first), std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  CHECK(bytes.size() > 3 * 4096);
  const fs::path damaged = scratch / "damaged.lmdb";
  auto write = [&](const std::vector<uint8_t>& b) {
    std::ofstream out(damaged, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  };
  int truncations = 0, refused = 0;
  for (size_t cut = 0; cut < bytes.size(); cut += (cut < 8192 ? 509 : 4093)) {
    write(std::vector<uint8_t>(bytes.begin(), bytes.begin() + static_cast<long>(cut)));
    ++truncations;
    try {
      ShardFile shard(utf8(damaged), kPerShard, true);
    } catch (const CorruptShardError&) {
      ++refused;
    }
  }
  CHECK(refused == truncations);
  // Byte flips everywhere: the file is refused, or a record fails to decode,
  // or every sample is right. Nothing else.
  int flips = 0, wrong = 0;
  for (size_t pos = 0; pos < bytes.size(); pos += 97) {
    auto b = bytes;
    b[pos] ^= 0x41;
    write(b);
    ++flips;
    try {
      const ShardSet shards({utf8(damaged)}, {kPerShard}, packed(1));
      if (count_good_samples(shards) != kPerShard) ++wrong;
    } catch (const CorruptShardError&) {
    } catch (const CorruptRecordError&) {
    } catch (const DecodeError&) {
    }
  }
  CHECK(flips > 100);
  CHECK(wrong == 0);
  std::printf("shard_tests: %d truncations refused, %d byte flips caught or harmless\n", truncations, flips);
  // Shards are opened several at once: the error is always the lowest bad shard's, as opened in order.
  write(std::vector<uint8_t>(bytes.begin(), bytes.begin() + 100));
  const fs::path later = scratch / "damaged-later.lmdb";
  fs::copy_file(damaged, later, fs::copy_options::overwrite_existing);
  std::vector<std::string> paths(12, first);
  paths[4] = utf8(damaged);
  paths[9] = utf8(later);
  for (int run = 0; run < 20; ++run) {
    std::string message;
    try {
      const ShardSet shards(paths, std::vector<uint64_t>(paths.size(), kPerShard), packed(paths.size()));
    } catch (const CorruptShardError& e) {
      message = e.what();
    }
    CHECK(message.find("damaged.lmdb") != std::string::npos);
  }
  paths[4] = first;  // the other bad one alone: found too, whichever thread opens it
  bool later_refused = false;
  try {
    const ShardSet shards(paths, std::vector<uint64_t>(paths.size(), kPerShard), packed(paths.size()));
  } catch (const CorruptShardError& e) {
    later_refused = std::string(e.what()).find("damaged-later.lmdb") != std::string::npos;
  }
  CHECK(later_refused);
}

#ifndef _WIN32
// A shard cut short while mapped (POSIX lets a mapped file shrink): the BatchReader's next batch over
// the vanished pages is a CorruptShardError "changed while being read" naming the file, never SIGBUS,
// and no later read of that shard is delivered, even of pages still there.
void test_shrunk_while_mapped(const fs::path& dataset, const fs::path& scratch) {
  const fs::path copy = scratch / "shrinks.lmdb";
  fs::copy_file(shard_paths(dataset)[0], copy, fs::copy_options::overwrite_existing);
  const uint64_t full = fs::file_size(copy);
  auto shards = std::make_shared<const ShardSet>(std::vector<std::string>{utf8(copy)},
                                                 std::vector<uint64_t>{kPerShard}, packed(1));
  ReaderOptions options;
  options.batch_capacity = kPerShard;
  options.num_threads = 2;
  options.shard_fingerprints = written_fingerprints(*shards);
  BatchReader reader(shards, kFields, options);
  std::vector<std::vector<uint8_t>> memory(2, std::vector<uint8_t>(reader.slot_bytes()));
  for (auto& m : memory) reader.pool()->add(m.data(), m.size(), nullptr);
  std::vector<uint64_t> all(kPerShard);
  for (uint64_t i = 0; i < kPerShard; ++i) all[i] = i;
  auto read_all = [&](std::string* error) {
    reader.submit(all);
    try {
      auto batch = reader.wait_next(std::chrono::milliseconds(60000));
      return batch.has_value();
    } catch (const CorruptShardError& e) {
      *error = e.what();
      return false;
    }
  };
  std::string error;
  CHECK(read_all(&error) && error.empty());
  fs::resize_file(copy, 4096 * 2);  // the meta pages stay; every record page is gone
  CHECK(!read_all(&error));
  CHECK(error.find("changed while being read") != std::string::npos);
  CHECK(error.find("shrinks.lmdb") != std::string::npos);
  fs::resize_file(copy, full);  // grown back (zeros): the mapping stays refused
  error.clear();
  CHECK(!read_all(&error));
  CHECK(error.find("changed while being read") != std::string::npos);
}
#endif

// Reading leaves the file as it was; a read-only file and a non-ASCII path are fine.
void test_file_system(const fs::path& dataset, const fs::path& scratch) {
  const fs::path copy = copy_dataset(dataset, scratch / fs::u8path(u8"donn\u00e9es \u6570\u636e \u0394"));
  const std::vector<std::string> paths = shard_paths(copy);
  std::vector<uintmax_t> sizes;
  std::vector<fs::file_time_type> times;
  for (const auto& p : paths) {
    fs::permissions(from_utf8(p), fs::perms::owner_write | fs::perms::group_write | fs::perms::others_write,
                    fs::perm_options::remove);
#ifdef _WIN32
    const DWORD attributes = GetFileAttributesW(utf8_to_wide(p).c_str());
    CHECK(attributes != INVALID_FILE_ATTRIBUTES && (attributes & FILE_ATTRIBUTE_READONLY) != 0);
#endif
    sizes.push_back(fs::file_size(from_utf8(p)));
    times.push_back(fs::last_write_time(from_utf8(p)));
  }
  {
    const ShardSet shards(paths, shard_counts(), packed());
    CHECK(count_good_samples(shards) == kSamples);
  }
  for (size_t s = 0; s < paths.size(); ++s) {
    CHECK(fs::file_size(from_utf8(paths[s])) == sizes[s]);
    CHECK(fs::last_write_time(from_utf8(paths[s])) == times[s]);
    fs::permissions(from_utf8(paths[s]), fs::perms::owner_write, fs::perm_options::add);
  }
  bool not_found = false;
  try {
    FileMapping missing(utf8(copy / fs::u8path(u8"\u00e9-missing.lmdb")));
  } catch (const ShardNotFoundError& e) {
    not_found = std::string(e.what()).find(u8"\u00e9-missing") != std::string::npos;
  }
  CHECK(not_found);
  bool directory_refused = false;
  try {
    FileMapping dir(utf8(copy));
  } catch (const CorruptShardError&) {
    directory_refused = true;
  }
  CHECK(directory_refused);
}

#ifdef _WIN32

// A child process (this program with --hold) that opens `path` with `access`
// and `share`, signals `ready`, and waits for `release`.
int hold_file(const std::wstring& path, DWORD access, DWORD share) {
  HANDLE f = CreateFileW(path.c_str(), access, share, nullptr, OPEN_EXISTING, FILE_ATTRIBUTE_NORMAL, nullptr);
  if (f == INVALID_HANDLE_VALUE) return 3;
  HANDLE ready = OpenEventW(EVENT_MODIFY_STATE, FALSE, L"fastload-shard-tests-ready");
  HANDLE release = OpenEventW(SYNCHRONIZE, FALSE, L"fastload-shard-tests-release");
  if (ready == nullptr || release == nullptr) return 4;
  SetEvent(ready);
  WaitForSingleObject(release, 60000);
  CloseHandle(f);
  return 0;
}

// Runs `body` while another process holds `path` open in `mode` ("read" or "write").
template <class Body>
void while_held(const std::string& path, const char* mode, Body body) {
  HANDLE ready = CreateEventW(nullptr, TRUE, FALSE, L"fastload-shard-tests-ready");
  HANDLE release = CreateEventW(nullptr, TRUE, FALSE, L"fastload-shard-tests-release");
  wchar_t self[MAX_PATH];
  GetModuleFileNameW(nullptr, self, MAX_PATH);
  std::wstring cmd = L"\"" + std::wstring(self) + L"\" --hold " + utf8_to_wide(mode) + L" \"" + utf8_to_wide(path) + L"\"";
  STARTUPINFOW si{};
  si.cb = sizeof si;
  PROCESS_INFORMATION pi{};
  const bool started = CreateProcessW(nullptr, cmd.data(), nullptr, nullptr, FALSE, 0, nullptr, nullptr, &si, &pi);
  CHECK(started);
  if (started) {
    HANDLE both[] = {ready, pi.hProcess};
    const DWORD w = WaitForMultipleObjects(2, both, FALSE, 60000);
    CHECK(w == WAIT_OBJECT_0);
    if (w == WAIT_OBJECT_0) body();
    SetEvent(release);
    WaitForSingleObject(pi.hProcess, 60000);
    DWORD code = 1;
    GetExitCodeProcess(pi.hProcess, &code);
    CHECK(code == 0);
    CloseHandle(pi.hThread);
    CloseHandle(pi.hProcess);
  }
  CloseHandle(ready);
  CloseHandle(release);
}

void test_windows_paths(const fs::path& dataset) {
  const std::vector<std::string> paths = shard_paths(dataset);
  // Backslashes (the native form), forward slashes, and the drive letter in lower case.
  std::vector<std::string> slashed, lower;
  for (std::string p : paths) {
    CHECK(p.size() > 2 && p[1] == ':');
    std::string s = p;
    std::replace(s.begin(), s.end(), '\\', '/');
    slashed.push_back(s);
    std::string l = p;
    l[0] = static_cast<char>(std::tolower(static_cast<unsigned char>(l[0])));
    std::replace(l.begin(), l.end(), '/', '\\');
    lower.push_back(l);
  }
  CHECK(paths[0].find('\\') != std::string::npos);
  CHECK(count_good_samples(ShardSet(slashed, shard_counts(), packed())) == kSamples);
  CHECK(count_good_samples(ShardSet(lower, shard_counts(), packed())) == kSamples);
  bool invalid_utf8 = false;
  try {
    FileMapping bad(paths[0] + "\xff");
  } catch (const FastloadError& e) {
    invalid_utf8 = std::string(e.what()).find("not valid UTF-8") != std::string::npos;
  }
  CHECK(invalid_utf8);
}

void test_held_open(const fs::path& dataset) {
  const std::string path = shard_paths(dataset)[2];
  // Another reader (sharing reads, as py-lmdb's read-only open does) does not stop us.
  while_held(path, "read", [&] {
    const ShardSet shards({path}, {kSamples - 2 * kPerShard}, packed(1));
    CHECK(shards.total_records() == kSamples - 2 * kPerShard);
  });
  // A writer does: a loud error naming the file, not a read of a changing file.
  while_held(path, "write", [&] {
    bool refused = false;
    try {
      FileMapping m(path);
    } catch (const CorruptShardError& e) {
      const std::string what = e.what();
      refused = what.find("another process") != std::string::npos && what.find("shard-00002") != std::string::npos;
    }
    CHECK(refused);
  });
}

#endif

}  // namespace

// The Warmer: faults a buffer in and maps the shards' cached pages on its thread, leaves the contents alone,
// stops promptly, refuses a lazy set. Where the system has no such calls (Windows) it finishes at once.
void test_warmer(const fs::path& dataset) {
  auto shards = std::make_shared<const ShardSet>(shard_paths(dataset), shard_counts(), packed());
  uint64_t shard_bytes = 0;
  for (size_t i = 0; i < shards->size(); ++i) shard_bytes += shards->shard(i).mapping().size();
  std::vector<uint8_t> buffer((size_t{5} << 20) + 4096 * 3 + 17);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<uint8_t>(i * 13 + 1);
  const std::vector<uint8_t> before = buffer;
  {
    Warmer warmer({{buffer.data(), buffer.size()}}, shards, UINT64_MAX);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!warmer.stats().done && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    const Warmer::Stats done = warmer.stats();
    CHECK(done.done);
#ifdef __linux__
    if (!done.supported) {  // a kernel before 5.14, or a sandbox such as gVisor
      std::printf("shard_tests: no MADV_POPULATE_*: the Warmer's work is not checked\n");
    } else {
      CHECK(done.prefaulted_bytes == buffer.size());
      CHECK(done.mapped_bytes > 0 && done.mapped_bytes <= shard_bytes);  // the cached pages (just written)
      CHECK(done.seconds > 0);
    }
#else
    CHECK(!done.supported && done.mapped_bytes == 0);
#endif
    warmer.stop();
    warmer.stop();  // idempotent
  }
  CHECK(buffer == before);  // faulted in, never written
  {
    Warmer capped({}, shards, 1);  // looks at one step of the files at most
    capped.stop();
    CHECK(capped.stats().done && capped.stats().mapped_bytes <= (size_t{2} << 20));
  }
  {
    std::vector<uint8_t> big(size_t{64} << 20);
    Warmer stopped({{big.data(), big.size()}}, shards, UINT64_MAX);
    stopped.stop();  // at once: joined, whatever it had done
    const Warmer::Stats s = stopped.stats();
    CHECK(s.done && s.prefaulted_bytes <= big.size() && s.claimed_bytes <= big.size());
  }
#ifdef __linux__
  {  // After request_stop(), nothing past claimed_bytes is touched: its pages stay out of memory.
    const size_t size = size_t{64} << 20;
    void* fresh = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(fresh != MAP_FAILED);
    if (fresh != MAP_FAILED) {
      ::madvise(fresh, size, MADV_NOHUGEPAGE);  // page by page, so that residency shows exactly what was touched
      auto* bytes = static_cast<uint8_t*>(fresh);
      Warmer warmer({{bytes, size}}, nullptr, 0);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (warmer.stats().claimed_bytes == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::yield();  // until it is at work: stopped mid-buffer, most likely
      }
      warmer.request_stop();
      const uint64_t claimed = warmer.stats().claimed_bytes;
      warmer.stop();
      const Warmer::Stats s = warmer.stats();
      CHECK(claimed > 0 && s.prefaulted_bytes <= claimed && claimed <= s.prefaulted_bytes + (size_t{2} << 20));
      const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
      std::vector<unsigned char> resident(size / page);
      CHECK(::mincore(fresh, size, resident.data()) == 0);
      size_t past = 0, before = 0;
      for (size_t i = 0; i < resident.size(); ++i) {
        if ((resident[i] & 1) == 0) continue;
        (i * page < claimed ? before : past) += 1;
      }
      CHECK(past == 0);
      CHECK(before * page == s.prefaulted_bytes);
      ::munmap(fresh, size);
    }
  }
#endif
  auto lazy = std::make_shared<const ShardSet>(shard_counts(), packed());
  bool refused = false;
  try {
    Warmer warmer({}, lazy, UINT64_MAX);
  } catch (const FastloadError&) {
    refused = true;
  }
  CHECK(refused);
}

int main(int argc, char** argv) {
#ifdef _WIN32
  if (argc == 4 && std::string(argv[1]) == "--hold") {
    const bool write = std::string(argv[2]) == "write";
    return hold_file(utf8_to_wide(argv[3]), write ? GENERIC_READ | GENERIC_WRITE : GENERIC_READ,
                     write ? FILE_SHARE_READ : FILE_SHARE_READ | FILE_SHARE_WRITE);
  }
#endif
  if (argc != 2) {
    std::fprintf(stderr, "usage: shard_tests DIR (written by scripts/cross_test_shards.py)\n");
    return 2;
  }
  const fs::path dir = from_utf8(argv[1]);
  const fs::path dataset = dir / "dataset";
  const fs::path scratch = dir / "scratch";
  fs::remove_all(scratch);
  fs::create_directories(scratch);
  try {
    const std::vector<uint64_t> order = test_order(dir);
    test_threaded_read(dataset, order);
    test_threaded_read(dataset, order, 8, 2, 50);  // 8 threads taking 2 turns
    test_threaded_read(dataset, order, 3, 1, 20);  // one at a time
    test_threaded_read(dataset, order, 2, 5, 20);  // more turns than threads: every thread runs
    test_planned_read(dir, order);
    test_rank_plan_read(dir, order);
    test_consumer_waits_for_most_of_the_window(dataset);
    test_wait_next_without_a_wait(dataset);
    test_pool_carried_over(dataset);
    test_warmer(dataset);
    test_swapped_shards_refused(dataset);
    test_lazy_attach(dataset);
    test_detach_pinned(dataset);
    test_damaged_copies(dataset, scratch);
#ifndef _WIN32
    test_shrunk_while_mapped(dataset, scratch);
#endif
    test_file_system(dataset, scratch);
#ifdef __linux__
    test_thread_disk_faults(scratch);
#endif
    test_codecs(dir);
#ifdef _WIN32
    test_windows_paths(dataset);
    test_held_open(dataset);
#endif
  } catch (const std::exception& e) {
    test::unexpected(e);
  }
  fs::remove_all(scratch);
  return test::report("shard_tests");
}
