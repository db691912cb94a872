// Unit tests of the transform kernels and TransformPipeline's validation:
// gather against a naive per-element definition (every map shape, both
// layouts, every item size, with padding), channel selection, conversion and
// its float16/bfloat16 rounding. Run under ASan+UBSan by `make test-cpp`.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "errors.h"
#include "tests/check.h"
#include "transforms/kernels.h"
#include "transforms/pipeline.h"

using namespace fastload;
using namespace fastload::transforms;

namespace {

int64_t at(const Dims& d, int64_t c, int64_t y, int64_t x) {
  return d.hwc ? (y * d.w + x) * d.c + c : (c * d.h + y) * d.w + x;
}

// The definition: one element at a time.
std::vector<uint8_t> naive_gather(const std::vector<uint8_t>& src, const Dims& in, const Dims& out, size_t item,
                                  const int64_t* m, const std::vector<uint8_t>& pad) {
  std::vector<uint8_t> dst(static_cast<size_t>(out.elements()) * item);
  for (int64_t c = 0; c < out.c; ++c)
    for (int64_t y = 0; y < out.h; ++y)
      for (int64_t x = 0; x < out.w; ++x) {
        const int64_t iy = m[0] * y + m[1] * x + m[2], ix = m[3] * y + m[4] * x + m[5];
        const bool inside = iy >= 0 && iy < in.h && ix >= 0 && ix < in.w;
        std::memcpy(dst.data() + at(out, c, y, x) * item, inside ? src.data() + at(in, c, iy, ix) * item : pad.data(),
                    item);
      }
  return dst;
}

void test_gather_matches_the_definition() {
  std::mt19937_64 rng(7);
  const int64_t maps[][6] = {
      {1, 0, 0, 0, 1, 0},     {1, 0, -2, 0, 1, 3},  {1, 0, 3, 0, 1, -1},  {-1, 0, 5, 0, 1, 0},
      {1, 0, 0, 0, -1, 5},    {0, 1, 0, -1, 0, 5},  {-1, 0, 5, 0, -1, 5}, {0, -1, 5, 1, 0, 0},
      {0, 1, -1, 1, 0, -2},   {1, 0, 9, 0, 1, 0},   {1, 0, 0, 0, 1, -9},  {0, -1, 6, -1, 0, 7},
  };
  for (size_t item : {1, 2, 4, 8}) {
    for (int64_t channels : {1, 3, 4}) {
      for (bool hwc : {false, true}) {
        const Dims in{channels, 6, 6, hwc};
        const Dims out{channels, 5, 4, hwc};
        std::vector<uint8_t> src(static_cast<size_t>(in.elements()) * item);
        for (auto& b : src) b = static_cast<uint8_t>(rng());
        std::vector<uint8_t> pad_item(item);
        for (auto& b : pad_item) b = static_cast<uint8_t>(rng());
        std::vector<uint8_t> pad_pixel;  // what the pipeline hands the kernel in hwc
        for (int64_t c = 0; c < (hwc ? channels : 1); ++c) {
          pad_pixel.insert(pad_pixel.end(), pad_item.begin(), pad_item.end());
        }
        for (const auto& m : maps) {
          std::vector<uint8_t> dst(static_cast<size_t>(out.elements()) * item, 0xEE);
          gather(src.data(), in, dst.data(), out, item, m, pad_pixel.data());
          CHECK(dst == naive_gather(src, in, out, item, m, pad_item));
        }
      }
    }
  }
}

void test_select_channels() {
  for (bool hwc : {false, true}) {
    const Dims in{4, 2, 3, hwc}, out{3, 2, 3, hwc};
    std::vector<uint8_t> src(static_cast<size_t>(in.elements()) * 2);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
    const int64_t channels[] = {3, 0, 3};
    std::vector<uint8_t> dst(static_cast<size_t>(out.elements()) * 2);
    select_channels(src.data(), in, dst.data(), out, 2, channels);
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 2; ++y)
        for (int64_t x = 0; x < 3; ++x)
          CHECK(std::memcmp(dst.data() + at(out, c, y, x) * 2, src.data() + at(in, channels[c], y, x) * 2, 2) == 0);
  }
}

void test_rounding() {
  // From tests/data/transform_vectors.json.
  const float in[] = {0.0f, -0.0f, 1.0f, 1.0009765625f, 65504.0f, 65519.0f, 65520.0f, 1e-5f, 6e-8f, 2.9e-8f, -3.0e-8f};
  const uint16_t half[] = {0, 32768, 15360, 15361, 31743, 31743, 31744, 168, 1, 0, 32769};
  for (size_t i = 0; i < sizeof(in) / sizeof(in[0]); ++i) CHECK(float_to_half(in[i]) == half[i]);
  // Every finite half survives a round trip through float; NaNs come back as the canonical positive quiet NaN.
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      CHECK(float_to_half(f) == 0x7E00u);
    } else {
      CHECK(float_to_half(f) == h);
    }
  }
  CHECK(float_to_bfloat16(1.0f) == 0x3F80);
  CHECK(float_to_bfloat16(1.00390625f) == 0x3F80);  // a tie: to even
  CHECK(float_to_bfloat16(1.01171875f) == 0x3F82);  // a tie: to even, upwards
  CHECK(float_to_bfloat16(std::nanf("")) == 0x7FC0);
}

void test_convert() {
  const Dims d{2, 1, 3, false};
  const uint16_t src[] = {0, 1000, 65535, 7, 8, 9};
  const float mean[] = {10.0f, 2.0f}, stdev[] = {4.0f, 0.5f};
  float out[6];
  convert(reinterpret_cast<const uint8_t*>(src), DType::kU16, d, reinterpret_cast<uint8_t*>(out), DType::kF32,
          ConvertMode::kNormalize, 1.0f, mean, stdev);
  for (int i = 0; i < 6; ++i) CHECK(out[i] == (static_cast<float>(src[i]) - mean[i / 3]) / stdev[i / 3]);
  const Dims hwc{2, 1, 3, true};
  convert(reinterpret_cast<const uint8_t*>(src), DType::kU16, hwc, reinterpret_cast<uint8_t*>(out), DType::kF32,
          ConvertMode::kNormalize, 1.0f, mean, stdev);
  for (int i = 0; i < 6; ++i) CHECK(out[i] == (static_cast<float>(src[i]) - mean[i % 2]) / stdev[i % 2]);
  uint16_t halves[6];
  convert(reinterpret_cast<const uint8_t*>(src), DType::kU16, d, reinterpret_cast<uint8_t*>(halves), DType::kF16,
          ConvertMode::kScale, 0.5f, nullptr, nullptr);
  for (int i = 0; i < 6; ++i) CHECK(halves[i] == float_to_half(static_cast<float>(src[i]) * 0.5f));
}

void test_fill_rects() {
  for (bool hwc : {false, true}) {
    const Dims d{2, 4, 5, hwc};
    std::vector<uint16_t> data(static_cast<size_t>(d.elements()), 1);
    const int64_t rects[] = {1, 3, -2, 2, 3, 99, 4, 5};  // clamped: rows 1-2 x cols 0-1, rows 3 x col 4
    const uint16_t value = 7;
    fill_rects(reinterpret_cast<uint8_t*>(data.data()), d, 2, rects, 2, reinterpret_cast<const uint8_t*>(&value));
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t y = 0; y < 4; ++y)
        for (int64_t x = 0; x < 5; ++x) {
          const bool inside = (y >= 1 && y < 3 && x < 2) || (y == 3 && x == 4);
          CHECK(data[static_cast<size_t>(at(d, c, y, x))] == (inside ? 7 : 1));
        }
  }
}

void test_resize() {
  for (bool hwc : {false, true}) {
    const Dims in{3, 6, 8, hwc};
    std::vector<uint8_t> src(static_cast<size_t>(in.elements()));
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 37 + 11);
    // Bilinear onto the same size is the identity; so is a nearest resize.
    for (bool bilinear : {false, true}) {
      std::vector<uint8_t> same(src.size());
      const int64_t whole[] = {0, 0, 6, 8};
      resize(src.data(), DType::kU8, in, same.data(), in, whole, bilinear);
      CHECK(same == src);
    }
    // Nearest halving of the box rows 2..5, columns 0..7 takes its odd rows and columns.
    const Dims out{3, 2, 4, hwc};
    std::vector<uint8_t> half(static_cast<size_t>(out.elements()));
    const int64_t box[] = {2, 0, 4, 8};
    resize(src.data(), DType::kU8, in, half.data(), out, box, false);
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 2; ++y)
        for (int64_t x = 0; x < 4; ++x) {
          CHECK(half[static_cast<size_t>(at(out, c, y, x))] ==
                src[static_cast<size_t>(at(in, c, 2 + 2 * y + 1, 2 * x + 1))]);
        }
    // Bilinear halving is the mean of each 2x2 block, rounded half to even.
    resize(src.data(), DType::kU8, in, half.data(), out, box, true);
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t y = 0; y < 2; ++y)
        for (int64_t x = 0; x < 4; ++x) {
          float sum = 0;
          for (int64_t dy = 0; dy < 2; ++dy)
            for (int64_t dx = 0; dx < 2; ++dx) sum += src[static_cast<size_t>(at(in, c, 2 + 2 * y + dy, 2 * x + dx))];
          CHECK(half[static_cast<size_t>(at(out, c, y, x))] == static_cast<uint8_t>(std::nearbyint(sum / 4)));
        }
    // A box reaching past the input is clamped to it, never read out of bounds (ASan checks).
    const int64_t wild[] = {5, 7, 100, 100};
    resize(src.data(), DType::kU8, in, half.data(), out, wild, true);
    CHECK(half[0] == src[static_cast<size_t>(at(in, 0, 5, 7))]);
  }
}

TransformStep crop_step(int64_t size) {
  TransformStep s;
  s.kind = TransformStep::kGather;
  s.in = Dims{3, 8, 8, false};
  s.out = Dims{3, size, size, false};
  s.pad = std::string(1, '\0');
  return s;
}

bool throws(std::vector<TransformStep> steps, std::vector<uint64_t> bytes, size_t params) {
  try {
    TransformPipeline p(std::move(steps), bytes, params);
  } catch (const FastloadError&) {
    return true;
  }
  return false;
}

void test_pipeline_validation_and_run() {
  CHECK(!throws({crop_step(4)}, {192}, 6));
  CHECK(throws({crop_step(4)}, {191}, 6));   // the field is not that size
  CHECK(throws({crop_step(4)}, {192}, 5));   // parameters beyond the sample's
  CHECK(throws({crop_step(4)}, {}, 6));      // no such field
  TransformStep sel;
  sel.kind = TransformStep::kSelect;
  sel.in = Dims{3, 4, 4, false};
  sel.out = Dims{1, 4, 4, false};
  sel.channels = {3};
  CHECK(throws({crop_step(4), sel}, {192}, 6));  // channel out of range
  sel.channels = {2};
  CHECK(!throws({crop_step(4), sel}, {192}, 6));
  sel.in.h = 5;
  CHECK(throws({crop_step(4), sel}, {192}, 6));  // does not read what the step before wrote

  sel.in.h = 4;
  TransformPipeline p({crop_step(4), sel}, {192, 8}, 6);
  CHECK(p.transforms(0) && !p.transforms(1) && p.out_bytes(0) == 16 && p.out_bytes(1) == 8);
  std::vector<uint8_t> src(192), dst(16), a(p.scratch_bytes()), b(p.scratch_bytes());
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i);
  const int64_t params[] = {1, 0, 2, 0, 1, 3};
  p.run(0, src.data(), dst.data(), params, a.data(), b.data());
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t x = 0; x < 4; ++x) {
      CHECK(dst[static_cast<size_t>(y * 4 + x)] == src[static_cast<size_t>(2 * 64 + (y + 2) * 8 + x + 3)]);
    }
}

}  // namespace

int main() {
  test_gather_matches_the_definition();
  test_select_channels();
  test_rounding();
  test_convert();
  test_fill_rects();
  test_resize();
  test_pipeline_validation_and_run();
  return test::report("transform_tests");
}
