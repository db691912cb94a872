// Unit tests of the core that need no Python: the record decoder's bounds
// checks at every truncation point for every codec (png and jpeg payloads
// made with libspng's and TurboJPEG's encoders), the shuffle, the
// permutation, prefaulting a fresh buffer. Run under ASan+UBSan by `make test-cpp`.
#include <lz4.h>
#include <spng.h>
#include <turbojpeg.h>
#include <zstd.h>

#include <cstdlib>

#if defined(__linux__)
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>
#endif

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "checked_math.h"
#include "errors.h"
#include "format/record_decoder.h"
#include "platform/file_mapping.h"
#include "platform/platform.h"
#include "reader/batch_reader.h"
#include "reader/permutation.h"
#include "reader/slot_pool.h"
#include "tests/check.h"

using namespace fastload;

namespace {

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

// Options for records of the current version (v3) whose binding fingerprint is kFingerprint.
DecoderOptions v2_options() { return DecoderOptions{true, kDefaultMaxSampleBytes, kRecordVersion, kFingerprint}; }

// One record of one field, encoded with `codec`, in record version `version`
// (v2, v3: with key kKey and fingerprint kFingerprint).
std::vector<uint8_t> record_of(const std::vector<uint8_t>& data, const std::vector<uint8_t>& payload, Codec codec,
                               uint16_t version = kRecordVersion) {
  std::vector<uint8_t> rec;
  put(rec, kRecordMagic, 4);
  put(rec, version, 2);
  put(rec, 1, 2);
  if (version >= 2) {
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

std::vector<uint8_t> make_record(const std::vector<uint8_t>& data, Codec codec, size_t itemsize,
                                 uint16_t version = kRecordVersion) {
  std::vector<uint8_t> payload;
  const bool shuffled = codec == Codec::kZstdShuffle || codec == Codec::kLz4Shuffle;
  const std::vector<uint8_t> src = shuffled ? shuffle(data, itemsize) : data;
  if (codec == Codec::kRaw) {
    payload = data;
  } else if (codec == Codec::kLz4 || codec == Codec::kLz4Shuffle) {
    payload.resize(static_cast<size_t>(LZ4_compressBound(static_cast<int>(src.size()))));
    const int n = LZ4_compress_default(reinterpret_cast<const char*>(src.data()), reinterpret_cast<char*>(payload.data()),
                                       static_cast<int>(src.size()), static_cast<int>(payload.size()));
    payload.resize(static_cast<size_t>(n));
  } else {
    payload.resize(ZSTD_compressBound(src.size()));
    payload.resize(ZSTD_compress(payload.data(), payload.size(), src.data(), src.size(), 3));
  }
  return record_of(data, payload, codec, version);
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
  for (Codec codec : {Codec::kRaw, Codec::kZstd, Codec::kZstdShuffle, Codec::kLz4, Codec::kLz4Shuffle}) {
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
  // The field count is bounded (kMaxFields), not only by the header's 16 bits.
  CHECK(schema_refused({}, kDefaultMaxSampleBytes));
  CHECK(!schema_refused(std::vector<FieldSpec>(kMaxFields, FieldSpec{Codec::kRaw, 1, 1}), kDefaultMaxSampleBytes));
  CHECK(schema_refused(std::vector<FieldSpec>(kMaxFields + 1, FieldSpec{Codec::kRaw, 1, 1}), kDefaultMaxSampleBytes));
  uint64_t out = 0;
  CHECK(!checked_mul<uint64_t>(16, uint64_t{1} << 60, &out));
  CHECK(checked_mul<uint64_t>(16, uint64_t{1} << 59, &out) && out == uint64_t{1} << 63);
  CHECK(!range_inside(10, UINT64_MAX, 20));
  CHECK(range_inside(10, 10, 20) && !range_inside(11, 10, 20));
}

// Issue 10's overflow: shape [2**60] uint8 in batches of 16 wrapped the slot size to 128 bytes.
void test_batch_slot_size_is_checked() {
  auto shards = std::make_shared<const ShardSet>(std::vector<std::string>{}, std::vector<uint64_t>{}, std::vector<bool>{});
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
  RecordDecoder other_schema({spec}, DecoderOptions{true, kDefaultMaxSampleBytes, kRecordVersion, kFingerprint ^ 1});
  CHECK(decode_throws(other_schema, rec, out.data()));
  const auto v1_rec = make_record(data, Codec::kZstd, 1, 1);
  CHECK(decode_throws(v2, v1_rec, out.data()));  // a v1 record in a v3 dataset
  // v3: the fingerprint each shard's records carry is given per call (the shard's binding).
  uint8_t* dest[] = {out.data()};
  bool refused = false;
  try {
    v2.decode(rec.data(), rec.size(), dest, kKey, kFingerprint + 1);  // another shard's or dataset's binding
  } catch (const DecodeError& err) {
    refused = std::string(err.what()).find("for another shard position") != std::string::npos;
  }
  CHECK(refused);
  v2.decode(rec.data(), rec.size(), dest, kKey, kFingerprint);
  CHECK(out == data);
  const auto old_rec = make_record(data, Codec::kZstd, 1, 2);
  CHECK(decode_throws(v2, old_rec, out.data()));  // a v2 record in a v3 dataset
  RecordDecoder old({spec}, DecoderOptions{true, kDefaultMaxSampleBytes, 2, kFingerprint});
  CHECK(!decode_throws(old, old_rec, out.data()));
  CHECK(decode_throws(old, rec, out.data()));  // a v3 record in a v2 dataset
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

// An lz4 block that decodes to fewer or more bytes than the field is refused.
void test_lz4_size_is_exact() {
  std::vector<uint8_t> data(1000, 7);
  RecordDecoder dec({FieldSpec{Codec::kLz4, 1, data.size()}}, v2_options());
  std::vector<uint8_t> out(data.size());
  for (size_t n : {999u, 1001u, 0u}) {
    std::vector<uint8_t> other(n, 7);
    auto rec = make_record(other, Codec::kLz4, 1);
    // The entry claims the field's size D; the block holds n bytes.
    for (int i = 0; i < 8; ++i) rec[24 + 8 + i] = static_cast<uint8_t>(data.size() >> (8 * i));
    CHECK(decode_throws(dec, rec, out.data()));
  }
}

// A PNG of `channels` 8-bit interleaved channels, from libspng's encoder.
std::vector<uint8_t> encode_png(const std::vector<uint8_t>& hwc, uint32_t height, uint32_t width, uint32_t channels) {
  static const uint8_t kColor[] = {0, SPNG_COLOR_TYPE_GRAYSCALE, SPNG_COLOR_TYPE_GRAYSCALE_ALPHA,
                                   SPNG_COLOR_TYPE_TRUECOLOR, SPNG_COLOR_TYPE_TRUECOLOR_ALPHA};
  spng_ctx* ctx = spng_ctx_new(SPNG_CTX_ENCODER);
  spng_set_option(ctx, SPNG_ENCODE_TO_BUFFER, 1);
  spng_ihdr ihdr{width, height, 8, kColor[channels], 0, 0, 0};
  spng_set_ihdr(ctx, &ihdr);
  std::vector<uint8_t> out;
  if (spng_encode_image(ctx, hwc.data(), hwc.size(), SPNG_FMT_PNG, SPNG_ENCODE_FINALIZE) == 0) {
    size_t size = 0;
    int err = 0;
    auto* buf = static_cast<uint8_t*>(spng_get_png_buffer(ctx, &size, &err));
    if (buf != nullptr) out.assign(buf, buf + size);
    std::free(buf);
  }
  spng_ctx_free(ctx);
  return out;
}

std::vector<uint8_t> encode_jpeg(const std::vector<uint8_t>& hwc, int height, int width, int channels) {
  tjhandle tj = tjInitCompress();
  unsigned char* buf = nullptr;
  unsigned long size = 0;
  std::vector<uint8_t> out;
  if (tjCompress2(tj, hwc.data(), width, 0, height, channels == 1 ? TJPF_GRAY : TJPF_RGB, &buf, &size,
                  channels == 1 ? TJSAMP_GRAY : TJSAMP_420, 90, 0) == 0) {
    out.assign(buf, buf + size);
  }
  tjFree(buf);
  tjDestroy(tj);
  return out;
}

std::vector<uint8_t> to_planar(const std::vector<uint8_t>& hwc, size_t pixels, size_t channels) {
  std::vector<uint8_t> out(hwc.size());
  for (size_t i = 0; i < pixels; ++i)
    for (size_t c = 0; c < channels; ++c) out[c * pixels + i] = hwc[i * channels + c];
  return out;
}

// Round trips in both layouts; every truncation, flip and wrong geometry is a
// DecodeError, never a crash (ASan) or a silent wrong sample.
void test_image_codecs() {
  const uint32_t h = 24, w = 40;
  for (Codec codec : {Codec::kPng, Codec::kJpeg}) {
    for (uint32_t channels : {1u, 2u, 3u, 4u}) {
      if (codec == Codec::kJpeg && channels != 1 && channels != 3) continue;
      std::vector<uint8_t> hwc(size_t{h} * w * channels);
      for (size_t i = 0; i < hwc.size(); ++i) {  // smooth gradients: what jpeg keeps well
        const size_t p = i / channels;
        hwc[i] = static_cast<uint8_t>(p % w * 3 + p / w * 2 + (i % channels) * 20);
      }
      const auto payload = codec == Codec::kPng ? encode_png(hwc, h, w, channels)
                                                : encode_jpeg(hwc, static_cast<int>(h), static_cast<int>(w),
                                                              static_cast<int>(channels));
      CHECK(!payload.empty());
      // What the decoder yields (jpeg is lossy: its own decode is the reference).
      std::vector<uint8_t> decoded = hwc;
      if (codec == Codec::kJpeg) {
        ImageDecoder plain;
        plain.decode_jpeg(payload.data(), payload.size(), ImageGeometry{h, w, channels, false}, decoded.data(),
                          decoded.size());
        int worst = 0;
        for (size_t i = 0; i < hwc.size(); ++i) worst = std::max(worst, std::abs(decoded[i] - hwc[i]));
        CHECK(worst <= 8);
      }
      for (bool planar : {false, true}) {
        const auto expect = planar ? to_planar(decoded, size_t{h} * w, channels) : decoded;
        const FieldSpec spec{codec, 1, expect.size(), false, ImageGeometry{h, w, channels, planar}};
        RecordDecoder dec({spec}, v2_options());
        const auto rec = record_of(expect, payload, codec);
        std::vector<uint8_t> out(expect.size());
        CHECK(!decode_throws(dec, rec, out.data()));
        CHECK(out == expect);
        for (size_t cut = 0; cut < rec.size(); cut += (cut < 200 ? 1 : 37)) {
          CHECK(decode_throws(dec, std::vector<uint8_t>(rec.begin(), rec.begin() + static_cast<long>(cut)),
                              out.data()));
        }
        for (size_t pos = 0; pos < rec.size(); pos += 7) {
          auto flipped = rec;
          flipped[pos] ^= 0x5A;
          // A flip in bytes the decoder ignores (JFIF density) may decode to the same sample: never to another.
          CHECK(decode_throws(dec, flipped, out.data()) || out == expect);
          // ... and a refused payload leaves the decoder fit for the next, intact one (TurboJPEG's
          // handle after a failed header read is not).
          std::fill(out.begin(), out.end(), uint8_t{0});
          CHECK(!decode_throws(dec, rec, out.data()) && out == expect);
        }
      }
      // A payload of another geometry than the field's is refused before decoding.
      for (const ImageGeometry& other : {ImageGeometry{h + 1, w, channels, false}, ImageGeometry{h, w - 1, channels, false},
                                         ImageGeometry{w, h, channels, false}}) {
        const size_t bytes = size_t{other.height} * other.width * channels;
        RecordDecoder dec({FieldSpec{codec, 1, bytes, false, other}}, v2_options());
        std::vector<uint8_t> out(bytes, 0xAB);
        CHECK(decode_throws(dec, record_of(std::vector<uint8_t>(bytes), payload, codec), out.data()));
        CHECK(std::all_of(out.begin(), out.end(), [](uint8_t b) { return b == 0xAB; }));
      }
      const uint32_t other_channels = channels == 1 ? 3 : 1;
      const size_t bytes = size_t{h} * w * other_channels;
      RecordDecoder dec({FieldSpec{codec, 1, bytes, false, ImageGeometry{h, w, other_channels, false}}}, v2_options());
      std::vector<uint8_t> out(bytes);
      CHECK(decode_throws(dec, record_of(std::vector<uint8_t>(bytes), payload, codec), out.data()));
      if (codec == Codec::kPng) {  // 8-bit samples where the field has 16-bit ones
        const size_t wide = size_t{h} * w * channels * 2;
        RecordDecoder dec16({FieldSpec{codec, 2, wide, false, ImageGeometry{h, w, channels, false}}}, v2_options());
        std::vector<uint8_t> out16(wide);
        CHECK(decode_throws(dec16, record_of(std::vector<uint8_t>(wide), payload, codec), out16.data()));
      }
    }
  }
  // Fields an image codec cannot hold are refused by the schema check.
  CHECK(schema_refused({FieldSpec{Codec::kPng, 1, 13 * 4, false, ImageGeometry{2, 2, 13, true}}}, 1000));
  CHECK(schema_refused({FieldSpec{Codec::kJpeg, 2, 3 * 4 * 2, false, ImageGeometry{2, 2, 3, true}}}, 1000));
  CHECK(schema_refused({FieldSpec{Codec::kJpeg, 1, 2 * 4, false, ImageGeometry{2, 2, 2, true}}}, 1000));
  CHECK(schema_refused({FieldSpec{Codec::kPng, 1, 12, false, ImageGeometry{2, 2, 2, true}}}, 1000));  // 12 != 8
  CHECK(schema_refused({FieldSpec{Codec::kPng, 1, 0, false, ImageGeometry{0, 0, 1, true}}}, 1000));
  CHECK(!schema_refused({FieldSpec{Codec::kPng, 2, 32, false, ImageGeometry{2, 2, 4, true}}}, 1000));
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

// prefault_for_writing leaves contents as they were, whatever the alignment and size; on Linux
// (MADV_POPULATE_WRITE, 5.14+) writing a prefaulted fresh mapping then takes no page faults.
void test_prefault_for_writing() {
  std::vector<uint8_t> buffer((size_t{4} << 20) + 12345);
  for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = static_cast<uint8_t>(i * 7 + 3);
  const std::vector<uint8_t> before = buffer;
  const bool supported = prefault_for_writing(buffer.data() + 7, buffer.size() - 13);
  const bool small = prefault_for_writing(buffer.data() + 1, 100);  // under a page: nothing to do
  const bool empty = prefault_for_writing(buffer.data(), 0);
  CHECK(buffer == before);
#if defined(__linux__)
  CHECK(small && empty);  // nothing to do is done, with or without the call
#else
  CHECK(!small && !empty);
#endif
#if defined(_WIN32)
  CHECK(!supported);  // no such call there: the caller stops asking
#endif
#if defined(__linux__)
  // Page faults taken by writing a byte of every page of a fresh 8 MiB mapping, prefaulted or not (the
  // control also counts what else writing costs, such as ASan's shadow memory).
  const auto faults_writing = [](bool prefault) -> long {
    const size_t size = size_t{8} << 20;
    void* fresh = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (fresh == MAP_FAILED) return -1;
    if (prefault) prefault_for_writing(fresh, size);
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    const long before = usage.ru_minflt;
    auto* bytes = static_cast<uint8_t*>(fresh);
    for (size_t i = 0; i < size; i += 4096) bytes[i] = 1;
    ::getrusage(RUSAGE_SELF, &usage);
    ::munmap(fresh, size);
    return usage.ru_minflt - before;
  };
  if (!supported) {
    std::printf("core_tests: this kernel has no MADV_POPULATE_WRITE: the fault count is not checked\n");
  } else {
    const long control = faults_writing(false);
    const long prefaulted = faults_writing(true);
    if (control < 256) {  // transparent huge pages for every mapping ("always"): a few faults either way
      std::printf("core_tests: %ld faults without prefaulting (huge pages): the fault count is not checked\n", control);
    } else {
      CHECK(prefaulted >= 0 && prefaulted * 4 < control);  // 2,048 pages: one fault each without it
      if (prefaulted * 4 >= control) std::printf("faults writing: %ld prefaulted, %ld not\n", prefaulted, control);
    }
  }
#endif
}

void test_map_cached_pages() {
  const std::string path = "core_tests_map_cached_pages.bin";
  const size_t size = (size_t{8} << 20) + 12345;
  {
    std::vector<uint8_t> data(size);
    for (size_t i = 0; i < size; ++i) data[i] = static_cast<uint8_t>(i * 5 + 2);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    CHECK(f != nullptr);
    if (f == nullptr) return;
    CHECK(std::fwrite(data.data(), 1, size, f) == size);
    std::fclose(f);  // just written: in the page cache
  }
  {
    const FileMapping mapping(path);
    size_t mapped = 0;
    const bool supported = map_cached_pages(mapping.data(), static_cast<size_t>(mapping.size()), &mapped);
    size_t none = 0;
    static_cast<void>(map_cached_pages(mapping.data(), 100, &none));
    CHECK(none == 0);  // under a page: nothing to map
#if defined(__linux__)
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    if (!supported) {
      std::printf("core_tests: this kernel has no MADV_POPULATE_READ: map_cached_pages is not checked\n");
    } else {
      CHECK(mapped > size / 2 && mapped <= size / page * page);  // the whole pages the cache holds: all, here
      // Which pages have a page-table entry: /proc/self/pagemap's "present" bit (bit 63), which any process may
      // read for itself. Counting faults instead would count ASan's shadow memory and depend on folio sizes.
      const auto present_pages = [&](const FileMapping& m) -> long {
        const int fd = ::open("/proc/self/pagemap", O_RDONLY);
        if (fd < 0) return -1;
        const auto first = reinterpret_cast<uintptr_t>(m.data()) / page;
        const size_t pages = size / page;
        std::vector<uint64_t> entries(pages);
        const auto bytes = static_cast<ssize_t>(pages * sizeof(uint64_t));
        const bool read_all = ::pread(fd, entries.data(), static_cast<size_t>(bytes),
                                      static_cast<off_t>(first * sizeof(uint64_t))) == bytes;
        ::close(fd);
        if (!read_all) return -1;
        return static_cast<long>(std::count_if(entries.begin(), entries.end(), [](uint64_t e) { return e >> 63; }));
      };
      const FileMapping control(path);
      const long in_control = present_pages(control);
      const long in_mapping = present_pages(mapping);
      if (in_control < 0 || in_mapping < 0) {
        std::printf("core_tests: /proc/self/pagemap cannot be read: map_cached_pages's page tables not checked\n");
      } else {
        CHECK(in_control == 0);                                          // nothing read through it yet
        CHECK(static_cast<size_t>(in_mapping) * page == mapped);         // every page it says it mapped
      }
    }
#else
    CHECK(!supported && mapped == 0);
#endif
    for (size_t i = 0; i < size; i += 4099) CHECK(mapping.data()[i] == static_cast<uint8_t>(i * 5 + 2));
  }
  std::remove(path.c_str());
}

int main() {
  test_prefault_for_writing();
  test_map_cached_pages();
  test_slot_pool();
  check_portable_math<uint8_t>();
  check_portable_math<uint16_t>();
  check_portable_math<uint32_t>();
  check_portable_math<uint64_t>();
  test_round_trip_and_truncation();
  test_schema_sizes_are_checked();
  test_records_are_bound_to_key_schema_and_version();
  test_batch_slot_size_is_checked();
  test_lz4_size_is_exact();
  test_image_codecs();
  test_permutation();
  return test::report("core_tests");
}
