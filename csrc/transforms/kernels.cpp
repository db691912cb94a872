#include "transforms/kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <type_traits>

namespace fastload::transforms {
namespace {

uint32_t float_bits(float v) noexcept {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}

float bits_float(uint32_t b) noexcept {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}

// One unit is n bytes: an item of one plane (chw) or a whole pixel (hwc).
inline void gather_units(const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out, size_t n,
                         const int64_t* m, const uint8_t* pad) noexcept {
  const int64_t planes = in.hwc ? 1 : in.c;
  for (int64_t p = 0; p < planes; ++p) {
    const uint8_t* s = src + static_cast<size_t>(p * in.h * in.w) * n;
    uint8_t* o = dst + static_cast<size_t>(p * out.h * out.w) * n;
    for (int64_t y = 0; y < out.h; ++y) {
      int64_t iy = m[0] * y + m[2];
      int64_t ix = m[3] * y + m[5];
      for (int64_t x = 0; x < out.w; ++x, iy += m[1], ix += m[4], o += n) {
        if (iy >= 0 && iy < in.h && ix >= 0 && ix < in.w) {
          std::memcpy(o, s + static_cast<size_t>(iy * in.w + ix) * n, n);
        } else {
          std::memcpy(o, pad, n);
        }
      }
    }
  }
}

template <size_t N>
void gather_fixed(const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out, const int64_t* m,
                  const uint8_t* pad) noexcept {
  gather_units(src, in, dst, out, N, m, pad);
}

// Rows copied reversed: maps with m[1] = m[3] = 0 and m[4] = -1 (horizontal flips, with crops or pads).
template <size_t N>
void gather_rows_reversed(const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out, const int64_t* m,
                          const uint8_t* pad) noexcept {
  const int64_t planes = in.hwc ? 1 : in.c;
  // ix = f - x lies in [0, in.w) for x in (f - in.w, f]
  const int64_t x0 = std::max<int64_t>(0, m[5] - in.w + 1), x1 = std::min<int64_t>(out.w, m[5] + 1);
  for (int64_t p = 0; p < planes; ++p) {
    const uint8_t* s = src + static_cast<size_t>(p * in.h * in.w) * N;
    uint8_t* o = dst + static_cast<size_t>(p * out.h * out.w) * N;
    for (int64_t y = 0; y < out.h; ++y, o += static_cast<size_t>(out.w) * N) {
      const int64_t iy = m[0] * y + m[2];
      const bool row_inside = iy >= 0 && iy < in.h;
      const uint8_t* row = s + static_cast<size_t>(row_inside ? iy * in.w : 0) * N;
      for (int64_t x = 0; x < out.w; ++x) {
        const bool inside = row_inside && x >= x0 && x < x1;
        std::memcpy(o + static_cast<size_t>(x) * N, inside ? row + static_cast<size_t>(m[5] - x) * N : pad, N);
      }
    }
  }
}

// Rows copied whole: maps with m[1] = m[3] = 0 and m[4] = 1 (crops, pads, vertical flips).
void gather_rows(const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out, size_t item, const int64_t* m,
                 const uint8_t* pad) noexcept {
  const size_t px = in.hwc ? static_cast<size_t>(in.c) * item : item;  // bytes per pixel of one plane
  const int64_t planes = in.hwc ? 1 : in.c;
  const int64_t x0 = m[5] < 0 ? -m[5] : 0;                         // first x inside the input
  int64_t x1 = in.w - m[5];                                        // one past the last
  if (x1 > out.w) x1 = out.w;
  auto fill = [&](uint8_t* o, int64_t count) {
    for (int64_t i = 0; i < count; ++i) std::memcpy(o + static_cast<size_t>(i) * px, pad, px);
  };
  for (int64_t p = 0; p < planes; ++p) {
    const uint8_t* s = src + static_cast<size_t>(p * in.h * in.w) * px;
    uint8_t* o = dst + static_cast<size_t>(p * out.h * out.w) * px;
    for (int64_t y = 0; y < out.h; ++y, o += static_cast<size_t>(out.w) * px) {
      const int64_t iy = m[0] * y + m[2];
      if (iy < 0 || iy >= in.h || x1 <= x0) {
        fill(o, out.w);
        continue;
      }
      fill(o, x0);
      std::memcpy(o + static_cast<size_t>(x0) * px, s + static_cast<size_t>(iy * in.w + x0 + m[5]) * px,
                  static_cast<size_t>(x1 - x0) * px);
      fill(o + static_cast<size_t>(x1) * px, out.w - x1);
    }
  }
}

// Element loaders (to float32) and storers (from float32, rounding to nearest even).
// NaN is stored as the canonical positive quiet NaN: which NaN an operation
// on two NaNs returns depends on operand order, which numpy does not fix.
struct ToF32 {
  static void store(uint8_t* o, float y) noexcept {
    const float v = y != y ? bits_float(0x7FC00000u) : y;
    std::memcpy(o, &v, 4);
  }
};
struct ToF16 {
  static void store(uint8_t* o, float y) noexcept {
    const uint16_t h = float_to_half(y);
    std::memcpy(o, &h, 2);
  }
};
struct ToBF16 {
  static void store(uint8_t* o, float y) noexcept {
    const uint16_t h = float_to_bfloat16(y);
    std::memcpy(o, &h, 2);
  }
};

// One run of `n` elements with `stride` elements between them (1 in chw planes,
// c for one channel of hwc), all of one channel: y = (v - m) / sd or v * scale.
template <typename In, typename Out, bool kNormalize>
void convert_run(const uint8_t* src, uint8_t* dst, int64_t n, int64_t stride, float scale, float m, float sd) noexcept {
  constexpr size_t isize = In::kSize;
  const size_t osize = std::is_same_v<Out, ToF32> ? 4 : 2;
  if (stride == 1) {  // chw planes: a plain loop the compiler vectorises
    for (int64_t i = 0; i < n; ++i) {
      const float v = In::load(src + static_cast<size_t>(i) * isize);
      Out::store(dst + static_cast<size_t>(i) * osize, kNormalize ? (v - m) / sd : v * scale);
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    const size_t k = static_cast<size_t>(i * stride);
    const float v = In::load(src + k * isize);
    Out::store(dst + k * osize, kNormalize ? (v - m) / sd : v * scale);
  }
}

template <typename T>
struct Plain {
  static float load(const uint8_t* p) noexcept {
    T v;
    std::memcpy(&v, p, sizeof(T));
    return static_cast<float>(v);
  }
  static constexpr size_t kSize = sizeof(T);
};
struct Half {
  static float load(const uint8_t* p) noexcept {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return half_to_float(b);
  }
  static constexpr size_t kSize = 2;
};
struct BHalf {
  static float load(const uint8_t* p) noexcept {
    uint16_t b;
    std::memcpy(&b, p, 2);
    return bits_float(static_cast<uint32_t>(b) << 16);
  }
  static constexpr size_t kSize = 2;
};

template <typename In, typename Out>
void convert_typed(const uint8_t* src, const Dims& d, uint8_t* dst, ConvertMode mode, float scale, const float* mean,
                   const float* std) noexcept {
  const int64_t plane = d.h * d.w;
  const size_t isize = In::kSize;
  const size_t osize = std::is_same_v<Out, ToF32> ? 4 : 2;
  for (int64_t c = 0; c < d.c; ++c) {
    // chw: channel c is one contiguous plane; hwc: every c-th element from offset c.
    const size_t first = d.hwc ? static_cast<size_t>(c) : static_cast<size_t>(c * plane);
    const int64_t stride = d.hwc ? d.c : 1;
    if (mode == ConvertMode::kNormalize) {
      convert_run<In, Out, true>(src + first * isize, dst + first * osize, plane, stride, scale, mean[c], std[c]);
    } else {
      convert_run<In, Out, false>(src + first * isize, dst + first * osize, plane, stride, scale, 0.0f, 1.0f);
    }
  }
}

template <typename In>
void convert_to(const uint8_t* src, const Dims& d, uint8_t* dst, DType out, ConvertMode mode, float scale,
                const float* mean, const float* std) noexcept {
  switch (out) {
    case DType::kF32: return convert_typed<In, ToF32>(src, d, dst, mode, scale, mean, std);
    case DType::kF16: return convert_typed<In, ToF16>(src, d, dst, mode, scale, mean, std);
    default: return convert_typed<In, ToBF16>(src, d, dst, mode, scale, mean, std);
  }
}

template <typename T>
struct ToInt {
  static void store(uint8_t* o, float y) noexcept {
    const float lo = static_cast<float>(std::numeric_limits<T>::min());
    const float hi = static_cast<float>(std::numeric_limits<T>::max());
    const T v = static_cast<T>(std::nearbyint(std::min(std::max(y, lo), hi)));
    std::memcpy(o, &v, sizeof(T));
  }
};

struct Axis {  // one output coordinate's two source indices and the weight of the second
  int64_t i0, i1;
  float w;
};

std::vector<Axis> bilinear_axis(int64_t out, int64_t start, int64_t len) {
  std::vector<Axis> axis(static_cast<size_t>(out));
  const float scale = static_cast<float>(len) / static_cast<float>(out);
  for (int64_t i = 0; i < out; ++i) {
    float f = (static_cast<float>(i) + 0.5f) * scale - 0.5f;
    f = std::max(f, 0.0f);
    int64_t i0 = static_cast<int64_t>(std::floor(f));
    i0 = std::min(i0, len - 1);
    const int64_t i1 = std::min(i0 + 1, len - 1);
    axis[static_cast<size_t>(i)] = Axis{start + i0, start + i1, f - static_cast<float>(i0)};
  }
  return axis;
}

template <typename In, typename Out>
void resize_bilinear(const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out, size_t osize,
                     const std::vector<Axis>& ys, const std::vector<Axis>& xs) noexcept {
  const size_t isize = In::kSize;
  for (int64_t c = 0; c < out.c; ++c) {
    for (int64_t y = 0; y < out.h; ++y) {
      const Axis& ay = ys[static_cast<size_t>(y)];
      const float by = 1.0f - ay.w;
      for (int64_t x = 0; x < out.w; ++x) {
        const Axis& ax = xs[static_cast<size_t>(x)];
        auto at = [&](int64_t iy, int64_t ix) {
          const int64_t k = in.hwc ? (iy * in.w + ix) * in.c + c : (c * in.h + iy) * in.w + ix;
          return In::load(src + static_cast<size_t>(k) * isize);
        };
        const float bx = 1.0f - ax.w;
        const float r0 = bx * at(ay.i0, ax.i0) + ax.w * at(ay.i0, ax.i1);
        const float r1 = bx * at(ay.i1, ax.i0) + ax.w * at(ay.i1, ax.i1);
        const float v = by * r0 + ay.w * r1;
        const int64_t o = out.hwc ? (y * out.w + x) * out.c + c : (c * out.h + y) * out.w + x;
        Out::store(dst + static_cast<size_t>(o) * osize, v);
      }
    }
  }
}

template <typename In>
void resize_bilinear_to(DType dtype, const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out,
                        const std::vector<Axis>& ys, const std::vector<Axis>& xs) noexcept {
  switch (dtype) {
    case DType::kU8: return resize_bilinear<In, ToInt<uint8_t>>(src, in, dst, out, 1, ys, xs);
    case DType::kI8: return resize_bilinear<In, ToInt<int8_t>>(src, in, dst, out, 1, ys, xs);
    case DType::kU16: return resize_bilinear<In, ToInt<uint16_t>>(src, in, dst, out, 2, ys, xs);
    case DType::kI16: return resize_bilinear<In, ToInt<int16_t>>(src, in, dst, out, 2, ys, xs);
    case DType::kF16: return resize_bilinear<In, ToF16>(src, in, dst, out, 2, ys, xs);
    case DType::kBF16: return resize_bilinear<In, ToBF16>(src, in, dst, out, 2, ys, xs);
    default: return resize_bilinear<In, ToF32>(src, in, dst, out, 4, ys, xs);
  }
}

}  // namespace

void resize(const uint8_t* src, DType dtype, const Dims& in, uint8_t* dst, const Dims& out, const int64_t* box,
            bool bilinear) noexcept {
  const int64_t top = std::clamp<int64_t>(box[0], 0, in.h - 1), left = std::clamp<int64_t>(box[1], 0, in.w - 1);
  const int64_t bh = std::clamp<int64_t>(box[2], 1, in.h - top), bw = std::clamp<int64_t>(box[3], 1, in.w - left);
  if (!bilinear) {
    // A nearest resize is a gather of whole items (chw) or pixels (hwc).
    const size_t item = itemsize(dtype);
    const size_t unit = in.hwc ? static_cast<size_t>(in.c) * item : item;
    const float sy = static_cast<float>(bh) / static_cast<float>(out.h);
    const float sx = static_cast<float>(bw) / static_cast<float>(out.w);
    std::vector<int64_t> cols(static_cast<size_t>(out.w));
    for (int64_t x = 0; x < out.w; ++x) {
      const auto i = static_cast<int64_t>(std::floor((static_cast<float>(x) + 0.5f) * sx));
      cols[static_cast<size_t>(x)] = left + std::min(i, bw - 1);
    }
    const int64_t planes = in.hwc ? 1 : in.c;
    for (int64_t p = 0; p < planes; ++p) {
      for (int64_t y = 0; y < out.h; ++y) {
        const auto i = static_cast<int64_t>(std::floor((static_cast<float>(y) + 0.5f) * sy));
        const uint8_t* row = src + static_cast<size_t>((p * in.h + top + std::min(i, bh - 1)) * in.w) * unit;
        uint8_t* o = dst + static_cast<size_t>((p * out.h + y) * out.w) * unit;
        for (size_t x = 0; x < cols.size(); ++x) {
          std::memcpy(o + x * unit, row + static_cast<size_t>(cols[x]) * unit, unit);
        }
      }
    }
    return;
  }
  const std::vector<Axis> ys = bilinear_axis(out.h, top, bh), xs = bilinear_axis(out.w, left, bw);
  switch (dtype) {
    case DType::kU8: return resize_bilinear_to<Plain<uint8_t>>(dtype, src, in, dst, out, ys, xs);
    case DType::kI8: return resize_bilinear_to<Plain<int8_t>>(dtype, src, in, dst, out, ys, xs);
    case DType::kU16: return resize_bilinear_to<Plain<uint16_t>>(dtype, src, in, dst, out, ys, xs);
    case DType::kI16: return resize_bilinear_to<Plain<int16_t>>(dtype, src, in, dst, out, ys, xs);
    case DType::kF16: return resize_bilinear_to<Half>(dtype, src, in, dst, out, ys, xs);
    case DType::kBF16: return resize_bilinear_to<BHalf>(dtype, src, in, dst, out, ys, xs);
    default: return resize_bilinear_to<Plain<float>>(dtype, src, in, dst, out, ys, xs);
  }
}

size_t itemsize(DType dtype) noexcept {
  switch (dtype) {
    case DType::kU8: case DType::kI8: case DType::kBool: return 1;
    case DType::kU16: case DType::kI16: case DType::kF16: case DType::kBF16: return 2;
    case DType::kI32: case DType::kF32: return 4;
    case DType::kI64: case DType::kF64: return 8;
  }
  return 0;
}

void gather(const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out, size_t item, const int64_t* m,
            const uint8_t* pad) noexcept {
  if (m[1] == 0 && m[3] == 0 && m[4] == 1) return gather_rows(src, in, dst, out, item, m, pad);
  const size_t unit = in.hwc ? static_cast<size_t>(in.c) * item : item;
  if (m[1] == 0 && m[3] == 0 && m[4] == -1) {
    switch (unit) {
      case 1: return gather_rows_reversed<1>(src, in, dst, out, m, pad);
      case 2: return gather_rows_reversed<2>(src, in, dst, out, m, pad);
      case 3: return gather_rows_reversed<3>(src, in, dst, out, m, pad);
      case 4: return gather_rows_reversed<4>(src, in, dst, out, m, pad);
      case 8: return gather_rows_reversed<8>(src, in, dst, out, m, pad);
      default: break;
    }
  }
  switch (unit) {
    case 1: return gather_fixed<1>(src, in, dst, out, m, pad);
    case 2: return gather_fixed<2>(src, in, dst, out, m, pad);
    case 4: return gather_fixed<4>(src, in, dst, out, m, pad);
    case 8: return gather_fixed<8>(src, in, dst, out, m, pad);
    case 3: return gather_fixed<3>(src, in, dst, out, m, pad);
    default: return gather_units(src, in, dst, out, unit, m, pad);
  }
}

void select_channels(const uint8_t* src, const Dims& in, uint8_t* dst, const Dims& out, size_t item,
                     const int64_t* channels) noexcept {
  const size_t plane = static_cast<size_t>(in.h * in.w);
  if (!in.hwc) {
    for (int64_t k = 0; k < out.c; ++k) {
      std::memcpy(dst + static_cast<size_t>(k) * plane * item, src + static_cast<size_t>(channels[k]) * plane * item,
                  plane * item);
    }
    return;
  }
  for (size_t p = 0; p < plane; ++p) {
    const uint8_t* s = src + p * static_cast<size_t>(in.c) * item;
    uint8_t* o = dst + p * static_cast<size_t>(out.c) * item;
    for (int64_t k = 0; k < out.c; ++k) {
      std::memcpy(o + static_cast<size_t>(k) * item, s + static_cast<size_t>(channels[k]) * item, item);
    }
  }
}

void convert(const uint8_t* src, DType in, const Dims& dims, uint8_t* dst, DType out, ConvertMode mode, float scale,
             const float* mean, const float* std) noexcept {
  switch (in) {
    case DType::kU8: return convert_to<Plain<uint8_t>>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kI8: return convert_to<Plain<int8_t>>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kU16: return convert_to<Plain<uint16_t>>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kI16: return convert_to<Plain<int16_t>>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kI32: return convert_to<Plain<int32_t>>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kI64: return convert_to<Plain<int64_t>>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kF32: return convert_to<Plain<float>>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kF64: return convert_to<Plain<double>>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kF16: return convert_to<Half>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kBF16: return convert_to<BHalf>(src, dims, dst, out, mode, scale, mean, std);
    case DType::kBool: return convert_to<Plain<uint8_t>>(src, dims, dst, out, mode, scale, mean, std);
  }
}

void fill_rects(uint8_t* data, const Dims& d, size_t item, const int64_t* rects, size_t count,
                const uint8_t* value) noexcept {
  auto clamp = [](int64_t v, int64_t hi) { return v < 0 ? int64_t{0} : (v > hi ? hi : v); };
  for (size_t r = 0; r < count; ++r) {
    const int64_t top = clamp(rects[4 * r], d.h), bottom = clamp(rects[4 * r + 1], d.h);
    const int64_t left = clamp(rects[4 * r + 2], d.w), right = clamp(rects[4 * r + 3], d.w);
    for (int64_t c = 0; c < d.c; ++c)
      for (int64_t y = top; y < bottom; ++y)
        for (int64_t x = left; x < right; ++x) {
          const int64_t i = d.hwc ? (y * d.w + x) * d.c + c : (c * d.h + y) * d.w + x;
          std::memcpy(data + static_cast<size_t>(i) * item, value, item);
        }
  }
}

uint16_t float_to_bfloat16(float value) noexcept {
  const uint32_t b = float_bits(value);
  if ((b & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
  return static_cast<uint16_t>((b + 0x7FFFu + ((b >> 16) & 1u)) >> 16);
}

uint16_t float_to_half(float value) noexcept {
  const uint32_t b = float_bits(value);
  const uint32_t sign = (b >> 16) & 0x8000u;
  const uint32_t a = b & 0x7FFFFFFFu;
  uint32_t h;
  if (a > 0x7F800000u) {
    return 0x7E00u;  // NaN: the canonical positive quiet NaN
  } else if (a >= 0x477FF000u) {
    h = 0x7C00u;  // rounds to infinity
  } else if (a >= 0x38800000u) {
    h = (a - 0x38000000u + 0xFFFu + ((a >> 13) & 1u)) >> 13;
  } else if (a < 0x33000000u) {
    h = 0;
  } else {  // subnormal half: round m * 2^(e - 126 - 24) to an integer number of 2^-24
    const uint32_t shift = 126u - (a >> 23);
    const uint32_t m = (a & 0x7FFFFFu) | 0x800000u;
    const uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    h = r + ((rem > half || (rem == half && (r & 1u))) ? 1u : 0u);
  }
  return static_cast<uint16_t>(h | sign);
}

float half_to_float(uint16_t bits) noexcept {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t e = (bits >> 10) & 0x1Fu;
  const uint32_t m = bits & 0x3FFu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return bits_float(float_bits(v) | sign);
  }
  if (e == 31) return bits_float(sign | 0x7F800000u | (m << 13));
  return bits_float(sign | ((e + 112u) << 23) | (m << 13));
}

}  // namespace fastload::transforms
