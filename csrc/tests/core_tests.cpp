// Unit tests of the core that need no Python: the record decoder's bounds
// checks at every truncation point, the shuffle, the permutation. Run under
// ASan+UBSan by `make test-cpp`.
#include <zstd.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "batch_reader.h"
#include "checked_math.h"
#include "errors.h"
#include "permutation.h"
#include "record_decoder.h"
#include "slot_pool.h"

using namespace fastload;

namespace {

int failures = 0;
int checks = 0;

#define CHECK(cond)                                                   \
  do {                                                                \
    ++checks;                                                         \
    if (!(cond)) {                                                    \
      std::printf("FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);     \
      ++failures;                                                     \
    }                                                                 \
  } while (0)

void put(std::vector<uint8_t>& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

std::vector<uint8_t> shuffle(const std::vector<uint8_t>& src, size_t itemsize) {
  std::vector<uint8_t> out(src.size());
  const size_t n = src.size() / itemsize;
  for (size_t i = 0; i < n; ++i)
    for (size_t b = 0; b < itemsize; ++b) out[b * n + i] = src[i * itemsize + b];
  return out;
}

constexpr uint64_t kFingerprint = 0x0123456789ABCDEFull;
constexpr uint64_t kKey = 41;

DecoderOptions v2_options() { return DecoderOptions{true, kDefaultMaxSampleBytes, 2, kFingerprint}; }

// One record of one field, encoded with `codec`, in record version `version`
// (v2: with key kKey and fingerprint kFingerprint).
std::vector<uint8_t> make_record(const std::vector<uint8_t>& data, Codec codec, size_t itemsize,
                                 uint16_t version = 2) {
  std::vector<uint8_t> payload;
  if (codec == Codec::kRaw) {
    payload = data;
  } else {
    const std::vector<uint8_t> src = codec == Codec::kZstdShuffle ? shuffle(data, itemsize) : data;
    payload.resize(ZSTD_compressBound(src.size()));
    payload.resize(ZSTD_compress(payload.data(), payload.size(), src.data(), src.size(), 3));
  }
  std::vector<uint8_t> rec;
  put(rec, kRecordMagic, 4);
  put(rec, version, 2);
  put(rec, 1, 2);
  if (version == 2) {
    put(rec, kKey, 8);
    put(rec, kFingerprint, 8);
  }
  put(rec, static_cast<uint8_t>(codec), 1);
  put(rec, 0, 3);
  put(rec, payload.size(), 4);
  put(rec, data.size(), 8);
  put(rec, checksum(data.data(), data.size()), 8);
  rec.insert(rec.end(), payload.begin(), payload.end());
  return rec;
}

bool decode_throws(RecordDecoder& dec, const std::vector<uint8_t>& rec, uint8_t* out, uint64_t key = kKey) {
  uint8_t* dest[] = {out};
  try {
    dec.decode(rec.data(), rec.size(), dest, key);
  } catch (const DecodeError&) {
    return true;
  }
  return false;
}

void test_round_trip_and_truncation() {
  std::vector<uint8_t> data(4096);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>((i * 7) ^ (i >> 3));
  for (Codec codec : {Codec::kRaw, Codec::kZstd, Codec::kZstdShuffle}) {
    for (uint32_t itemsize : {1u, 2u, 4u, 8u}) {
      RecordDecoder dec({FieldSpec{codec, itemsize, data.size()}}, v2_options());
      const auto rec = make_record(data, codec, itemsize);
      std::vector<uint8_t> out(data.size());
      CHECK(!decode_throws(dec, rec, out.data()));
      CHECK(out == data);
      for (size_t cut = 0; cut < rec.size(); cut += (cut < 64 ? 1 : 97)) {
        const std::vector<uint8_t> truncated(rec.begin(), rec.begin() + static_cast<long>(cut));
        CHECK(decode_throws(dec, truncated, out.data()));
      }
      for (size_t pos = 0; pos < rec.size(); pos += 131) {
        auto flipped = rec;
        flipped[pos] ^= 0x5A;
        CHECK(decode_throws(dec, flipped, out.data()));
      }
      auto longer = rec;
      longer.push_back(0);
      CHECK(decode_throws(dec, longer, out.data()));
    }
  }
}

bool schema_refused(std::vector<FieldSpec> fields, uint64_t limit) {
  try {
    RecordDecoder dec(std::move(fields), DecoderOptions{true, limit});
  } catch (const FastloadError&) {
    return true;
  }
  return false;
}

void test_schema_sizes_are_checked() {
  const uint64_t huge = uint64_t{1} << 63;
  CHECK(schema_refused({FieldSpec{Codec::kZstd, 1, huge}, FieldSpec{Codec::kZstd, 1, huge}}, UINT64_MAX));
  CHECK(schema_refused({FieldSpec{Codec::kZstd, 1, uint64_t{1} << 60}}, kDefaultMaxSampleBytes));
  CHECK(schema_refused({FieldSpec{Codec::kRaw, 1, 600}, FieldSpec{Codec::kRaw, 1, 600}}, 1000));
  CHECK(schema_refused({FieldSpec{Codec::kRaw, 4, 6}}, 1000));
  CHECK(!schema_refused({FieldSpec{Codec::kRaw, 1, 500}, FieldSpec{Codec::kRaw, 1, 500}}, 1000));
  uint64_t out = 0;
  CHECK(!checked_mul<uint64_t>(16, uint64_t{1} << 60, &out));
  CHECK(checked_mul<uint64_t>(16, uint64_t{1} << 59, &out) && out == uint64_t{1} << 63);
  CHECK(!range_inside(10, UINT64_MAX, 20));
  CHECK(range_inside(10, 10, 20) && !range_inside(11, 10, 20));
}

// Issue 10's overflow: shape [2**60] uint8 in batches of 16 wrapped the slot size to 128 bytes.
void test_batch_slot_size_is_checked() {
  auto shards = std::make_shared<const ShardSet>(std::vector<std::string>{}, std::vector<uint64_t>{});
  auto refused = [&](uint64_t decoded, size_t capacity, uint64_t max_sample) {
    ReaderOptions options;
    options.batch_capacity = capacity;
    options.max_sample_bytes = max_sample;
    try {
      BatchReader reader(shards, {FieldSpec{Codec::kZstd, 1, decoded}}, options);
    } catch (const FastloadError&) {
      return true;
    }
    return false;
  };
  CHECK(refused(uint64_t{1} << 60, 16, kDefaultMaxSampleBytes));      // over the sample bound
  CHECK(refused(uint64_t{1} << 60, 16, uint64_t{1} << 62));           // 16 * 2**60 wraps
  CHECK(refused(uint64_t{1} << 58, 16, uint64_t{1} << 62));           // 2**62 bytes: more than memory
  CHECK(refused(SIZE_MAX - 10, 1, UINT64_MAX));                       // aligning up wraps
  CHECK(!refused(4096, 16, kDefaultMaxSampleBytes));
}

void test_records_are_bound_to_key_schema_and_version() {
  std::vector<uint8_t> data(256, 1);
  for (size_t i = 0; i < data.size(); i += 3) data[i] = 0;
  const FieldSpec spec{Codec::kZstd, 1, data.size(), true};
  RecordDecoder v2({spec}, v2_options());
  std::vector<uint8_t> out(data.size());
  const auto rec = make_record(data, Codec::kZstd, 1);
  CHECK(!decode_throws(v2, rec, out.data()));
  CHECK(!decode_throws(v2, rec, out.data(), kAnyKey));
  CHECK(decode_throws(v2, rec, out.data(), kKey + 1));  // delivered for another key
  RecordDecoder other_schema({spec}, DecoderOptions{true, kDefaultMaxSampleBytes, 2, kFingerprint ^ 1});
  CHECK(decode_throws(other_schema, rec, out.data()));
  const auto v1_rec = make_record(data, Codec::kZstd, 1, 1);
  CHECK(decode_throws(v2, v1_rec, out.data()));  // a v1 record in a v2 dataset
  RecordDecoder v1({spec}, DecoderOptions{true, kDefaultMaxSampleBytes, 1, 0});
  CHECK(!decode_throws(v1, v1_rec, out.data()));
  CHECK(out == data);
  CHECK(decode_throws(v1, rec, out.data()));  // a v2 record in a v1 dataset
  auto not_bool = data;
  not_bool[17] = 2;
  CHECK(decode_throws(v2, make_record(not_bool, Codec::kZstd, 1), out.data()));
  RecordDecoder as_bytes({FieldSpec{Codec::kZstd, 1, data.size()}}, v2_options());
  CHECK(!decode_throws(as_bytes, make_record(not_bool, Codec::kZstd, 1), out.data()));
}

void test_permutation() {
  for (uint64_t n : {0ull, 1ull, 2ull, 3ull, 7ull, 100ull, 1000ull, 4097ull}) {
    const Permutation p(42, 3, n);
    std::set<uint64_t> seen;
    for (uint64_t i = 0; i < n; ++i) seen.insert(p(i));
    CHECK(seen.size() == n);
    if (n > 0) CHECK(*seen.rbegin() == n - 1);
  }
  const Permutation a(1, 0, 1000), b(1, 1, 1000), c(2, 0, 1000);
  int same_ab = 0, same_ac = 0;
  for (uint64_t i = 0; i < 1000; ++i) {
    same_ab += a(i) == b(i);
    same_ac += a(i) == c(i);
  }
  CHECK(same_ab < 20);
  CHECK(same_ac < 20);
}

void test_slot_pool() {
  auto pool = std::make_shared<SlotPool>(16);
  std::vector<uint8_t> a(16), b(32);
  auto owner_a = std::make_shared<int>(1), owner_b = std::make_shared<int>(2);
  std::weak_ptr<int> weak_a = owner_a, weak_b = owner_b;
  pool->add(a.data(), a.size(), std::move(owner_a), /*reusable=*/true);
  pool->add(b.data(), b.size(), std::move(owner_b), /*reusable=*/false);
  CHECK(pool->total_count() == 2 && pool->free_count() == 2);
  auto first = pool->try_acquire();
  auto second = pool->try_acquire();
  CHECK(first && second && !pool->try_acquire());
  const bool single_use_first = first->data == b.data();
  auto& single = single_use_first ? first : second;
  single.reset();  // a single-use slot is freed, never pooled again
  CHECK(weak_b.expired());
  CHECK(pool->total_count() == 1 && pool->free_count() == 0);
  (single_use_first ? second : first).reset();  // a reusable slot comes back
  CHECK(pool->free_count() == 1 && !weak_a.expired());
  auto again = pool->try_acquire();
  CHECK(again && again->data == a.data());
  bool threw = false;
  try {
    pool->add(a.data(), 8, nullptr);
  } catch (const FastloadError&) {
    threw = true;
  }
  CHECK(threw);
  std::vector<uint8_t> f0(8), f1(8);
  pool->add_split({f0.data(), nullptr, f1.data()}, std::make_shared<int>(3), /*reusable=*/false);
  auto split = pool->try_acquire();
  CHECK(split && split->field_data.size() == 3 && split->field_data[0] == f0.data() && !split->field_data[1]);
}

// The portable overflow checks (used where the compiler has no builtins:
// MSVC) agree with the builtins on the edges.
template <typename T>
void check_portable_math() {
  const T max = std::numeric_limits<T>::max();
  const T values[] = {0, 1, 2, 3, static_cast<T>(max / 2), static_cast<T>(max / 2 + 1), static_cast<T>(max / 3),
                      static_cast<T>(max - 1), max};
  for (T a : values) {
    for (T b : values) {
      T x{}, y{};
      CHECK(portable_checked_add(a, b, &x) == checked_add(a, b, &y));
      if (checked_add(a, b, &y)) CHECK(portable_checked_add(a, b, &x) && x == y);
      CHECK(portable_checked_mul(a, b, &x) == checked_mul(a, b, &y));
      if (checked_mul(a, b, &y)) CHECK(portable_checked_mul(a, b, &x) && x == y);
    }
  }
}

}  // namespace

int main() {
  test_slot_pool();
  check_portable_math<uint8_t>();
  check_portable_math<uint16_t>();
  check_portable_math<uint32_t>();
  check_portable_math<uint64_t>();
  test_round_trip_and_truncation();
  test_schema_sizes_are_checked();
  test_records_are_bound_to_key_schema_and_version();
  test_batch_slot_size_is_checked();
  test_permutation();
  std::printf("core_tests: %d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
