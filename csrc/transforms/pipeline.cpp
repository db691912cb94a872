#include "transforms/pipeline.h"

#include <cstring>
#include <string>

#include "checked_math.h"
#include "errors.h"

namespace fastload {
namespace {

using transforms::Dims;
using transforms::DType;

uint64_t dims_bytes(const Dims& d, DType dtype, const std::string& what) {
  if (d.c <= 0 || d.h <= 0 || d.w <= 0) throw FastloadError(what + ": dimensions must be positive");
  uint64_t n = 0;
  if (!checked_mul(static_cast<uint64_t>(d.c), static_cast<uint64_t>(d.h), &n) ||
      !checked_mul(n, static_cast<uint64_t>(d.w), &n) || !checked_mul(n, uint64_t{transforms::itemsize(dtype)}, &n)) {
    throw FastloadError(what + ": size overflow");
  }
  return n;
}

bool is_float_out(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

void check_step(TransformStep& s, size_t num_params, const std::string& what) {
  const bool same_size = s.in.c == s.out.c && s.in.h == s.out.h && s.in.w == s.out.w;
  if (s.in.hwc != s.out.hwc) throw FastloadError(what + ": input and output layouts differ");
  switch (s.kind) {
    case TransformStep::kGather:
      if (s.in_dtype != s.out_dtype || s.in.c != s.out.c) {
        throw FastloadError(what + ": gather keeps dtype and channels");
      }
      if (s.param_offset > num_params || num_params - s.param_offset < 6) {
        throw FastloadError(what + ": parameters beyond the " + std::to_string(num_params) + " per sample");
      }
      if (s.pad.size() != transforms::itemsize(s.in_dtype)) throw FastloadError(what + ": pad is not one item");
      if (s.in.hwc) {  // the kernel takes a whole pixel of padding
        const std::string item = s.pad;
        for (int64_t c = 1; c < s.in.c; ++c) s.pad += item;
      }
      break;
    case TransformStep::kSelect:
      if (s.in_dtype != s.out_dtype || s.in.h != s.out.h || s.in.w != s.out.w) {
        throw FastloadError(what + ": select keeps dtype, height and width");
      }
      if (s.channels.size() != static_cast<size_t>(s.out.c)) {
        throw FastloadError(what + ": one index per output channel");
      }
      for (int64_t c : s.channels) {
        if (c < 0 || c >= s.in.c) throw FastloadError(what + ": channel " + std::to_string(c) + " out of range");
      }
      break;
    case TransformStep::kFill:
      if (!same_size || s.in_dtype != s.out_dtype) throw FastloadError(what + ": fill keeps dtype and shape");
      if (s.rects > num_params / 4 || s.param_offset > num_params - 4 * s.rects) {
        throw FastloadError(what + ": parameters beyond the " + std::to_string(num_params) + " per sample");
      }
      if (s.pad.size() != transforms::itemsize(s.in_dtype)) throw FastloadError(what + ": value is not one item");
      break;
    case TransformStep::kResize: {
      if (s.in_dtype != s.out_dtype || s.in.c != s.out.c) {
        throw FastloadError(what + ": resize keeps dtype and channels");
      }
      if (s.param_offset > num_params || num_params - s.param_offset < 4) {
        throw FastloadError(what + ": parameters beyond the " + std::to_string(num_params) + " per sample");
      }
      const DType d = s.in_dtype;
      const bool bilinear_ok = d == DType::kU8 || d == DType::kI8 || d == DType::kU16 || d == DType::kI16 ||
                               d == DType::kF16 || d == DType::kF32 || d == DType::kBF16;
      if (s.mode == transforms::ConvertMode::kNormalize && !bilinear_ok) {
        throw FastloadError(what + ": bilinear resize does not take this dtype");
      }
      break;
    }
    case TransformStep::kConvert:
      if (!same_size) throw FastloadError(what + ": convert keeps the shape");
      if (!is_float_out(s.out_dtype)) throw FastloadError(what + ": convert writes float32, float16 or bfloat16");
      if (s.in_dtype == DType::kBool) throw FastloadError(what + ": convert does not take bool");
      if (s.mode == transforms::ConvertMode::kNormalize &&
          (s.mean.size() != static_cast<size_t>(s.in.c) || s.std.size() != static_cast<size_t>(s.in.c))) {
        throw FastloadError(what + ": one mean and one std per channel");
      }
      break;
    default:
      throw FastloadError(what + ": unknown kind " + std::to_string(s.kind));
  }
}

}  // namespace

TransformPipeline::TransformPipeline(std::vector<TransformStep> steps, const std::vector<uint64_t>& decoded_bytes,
                                     size_t num_params)
    : per_field_(decoded_bytes.size()), in_bytes_(decoded_bytes), out_bytes_(decoded_bytes), num_params_(num_params) {
  for (size_t i = 0; i < steps.size(); ++i) {
    TransformStep& s = steps[i];
    const std::string what = "transform step " + std::to_string(i);
    if (s.field >= decoded_bytes.size()) throw FastloadError(what + ": no field " + std::to_string(s.field));
    if (static_cast<uint8_t>(s.in_dtype) > transforms::kMaxDType ||
        static_cast<uint8_t>(s.out_dtype) > transforms::kMaxDType) {
      throw FastloadError(what + ": unknown dtype code");
    }
    const uint64_t in_bytes = dims_bytes(s.in, s.in_dtype, what);
    const uint64_t out_bytes = dims_bytes(s.out, s.out_dtype, what);
    // The chain of a field: each step reads what the one before wrote.
    if (in_bytes != out_bytes_[s.field]) {
      throw FastloadError(what + ": reads " + std::to_string(in_bytes) + " bytes of field " + std::to_string(s.field) +
                          ", which holds " + std::to_string(out_bytes_[s.field]));
    }
    auto& chain = per_field_[s.field];
    if (!chain.empty() && (chain.back().out_dtype != s.in_dtype || chain.back().out.c != s.in.c ||
                           chain.back().out.h != s.in.h || chain.back().out.w != s.in.w)) {
      throw FastloadError(what + ": does not read what the step before it wrote");
    }
    check_step(s, num_params, what);
    out_bytes_[s.field] = out_bytes;
    if (out_bytes > scratch_bytes_) scratch_bytes_ = static_cast<size_t>(out_bytes);
    chain.push_back(std::move(s));
  }
}

void TransformPipeline::run(size_t field, const uint8_t* src, uint8_t* dst, const int64_t* params, uint8_t* a,
                            uint8_t* b) const {
  const auto& chain = per_field_[field];
  const uint8_t* in = src;
  for (size_t i = 0; i < chain.size(); ++i) {
    const TransformStep& s = chain[i];
    uint8_t* out = i + 1 == chain.size() ? dst : (in == a ? b : a);
    switch (s.kind) {
      case TransformStep::kGather:
        transforms::gather(in, s.in, out, s.out, transforms::itemsize(s.in_dtype), params + s.param_offset,
                           reinterpret_cast<const uint8_t*>(s.pad.data()));
        break;
      case TransformStep::kFill:
        std::memcpy(out, in, static_cast<size_t>(s.in.elements()) * transforms::itemsize(s.in_dtype));
        transforms::fill_rects(out, s.out, transforms::itemsize(s.in_dtype), params + s.param_offset, s.rects,
                               reinterpret_cast<const uint8_t*>(s.pad.data()));
        break;
      case TransformStep::kResize:
        transforms::resize(in, s.in_dtype, s.in, out, s.out, params + s.param_offset,
                           s.mode == transforms::ConvertMode::kNormalize);
        break;
      case TransformStep::kSelect:
        transforms::select_channels(in, s.in, out, s.out, transforms::itemsize(s.in_dtype), s.channels.data());
        break;
      default:
        transforms::convert(in, s.in_dtype, s.in, out, s.out_dtype, s.mode, s.scale, s.mean.data(), s.std.data());
        break;
    }
    in = out;
  }
}

}  // namespace fastload
