// Transform kernels: the per-sample byte and float work of fastload.transforms
// (docs/TRANSFORMS.md). Python compiles an op chain into steps and draws every
// random parameter; these functions only move and convert elements.
//
// A sample is viewed as (channels, height, width) in one of two layouts: chw
// (planes) or hwc (interleaved); a 2-D field is one channel. Floating point is
// float32, one IEEE operation at a time in the documented order: this file and
// kernels.cpp are compiled with -ffp-contract=off so that no fused multiply-add
// changes a bit against the numpy reference (python/fastload/transforms/_reference.py).
//
// Every function is pure, thread-safe and does not throw; the caller
// (TransformPipeline) validates sizes and dtypes first.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fastload::transforms {

// Codes shared with python/fastload/transforms/_spec.py (DTYPE_CODES).
enum class DType : uint8_t {
  kU8 = 0, kI8 = 1, kU16 = 2, kI16 = 3, kI32 = 4, kI64 = 5, kF16 = 6, kF32 = 7, kF64 = 8, kBool = 9, kBF16 = 10
};
constexpr uint8_t kMaxDType = 10;

size_t itemsize(DType dtype) noexcept;

struct Dims {
  int64_t c = 1, h = 1, w = 1;
  bool hwc = false;
  int64_t elements() const noexcept { return c * h * w; }
};

// out(c, y, x) = in(c, m[0]*y + m[1]*x + m[2], m[3]*y + m[4]*x + m[5]), or the
// pad value where that falls outside the input. `pad` holds one item (chw) or
// one whole pixel, in.c items (hwc). in and out share channels, layout and item size.
void gather(const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out, size_t item, const int64_t* m,
            const uint8_t* pad) noexcept;

// out channel k = in channel channels[k] (out.c of them), same h, w and layout.
void select_channels(const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out, size_t item,
                     const int64_t* channels) noexcept;

// Sets `count` rectangles (top, bottom, left, right: four int64 each in
// `rects`, clamped to the sample) to the item `value` in every channel, in place.
void fill_rects(uint8_t* data, const Dims& d, size_t item, const int64_t* rects, size_t count,
                const uint8_t* value) noexcept;

// Resamples the box box[0..3] = (top, left, height, width) of the input
// (clamped to it) to out.h x out.w. Nearest: source index floor((i + 0.5) *
// scale), any dtype. Bilinear (half-pixel centres, edges clamped, float32 in
// a fixed operation order, docs/TRANSFORMS.md): uint8, int8, uint16, int16
// (rounded to nearest even and clamped), float16, float32, bfloat16.
void resize(const uint8_t* src, DType dtype, const Dims& in, uint8_t* dst, const Dims& out, const int64_t* box,
            bool bilinear) noexcept;

enum class ConvertMode : uint8_t { kScale = 0, kNormalize = 1 };

// y = float32(x) * scale (kScale) or (float32(x) - mean[c]) / std[c]
// (kNormalize), rounded to nearest even into `out` (kF32, kF16 or kBF16).
void convert(const uint8_t* src, DType in, const Dims& dims, uint8_t* dst, DType out, ConvertMode mode, float scale,
             const float* mean, const float* std) noexcept;

// IEEE round-to-nearest-even conversions, NaN to the canonical positive quiet NaN.
uint16_t float_to_half(float value) noexcept;
uint16_t float_to_bfloat16(float value) noexcept;
float half_to_float(uint16_t bits) noexcept;

}  // namespace fastload::transforms
