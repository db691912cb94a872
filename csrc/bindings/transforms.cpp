// Transform steps as Python describes them (transforms/_spec.py) -> the core's TransformPipeline.
#include <string>
#include <utility>

#include "bindings/bindings.h"

namespace fastload::bindings {
namespace {

transforms::Dims to_dims(const std::vector<int64_t>& chw, bool hwc) {
  if (chw.size() != 3) throw py::value_error("a transform step's sizes are (channels, height, width)");
  return transforms::Dims{chw[0], chw[1], chw[2], hwc};
}

transforms::DType to_dtype(int code) {
  if (code < 0 || code > transforms::kMaxDType) throw py::value_error("unknown dtype code " + std::to_string(code));
  return static_cast<transforms::DType>(code);
}

}  // namespace

std::shared_ptr<const TransformPipeline> to_pipeline(const std::vector<StepTuple>& tuples,
                                                     const std::vector<FieldSpec>& specs, size_t num_params) {
  if (tuples.empty() && num_params == 0) return nullptr;
  std::vector<TransformStep> steps;
  for (const auto& [kind, field, in_dtype, in, hwc, out_dtype, out, offset, pad, channels, mode, scale, mean, std,
                    rects] : tuples) {
    if (kind < 0 || kind > TransformStep::kResize) throw py::value_error("unknown step kind " + std::to_string(kind));
    if (mode < 0 || mode > 1) throw py::value_error("unknown convert mode " + std::to_string(mode));
    TransformStep s;
    s.kind = static_cast<uint8_t>(kind);
    s.field = field;
    s.in_dtype = to_dtype(in_dtype);
    s.in = to_dims(in, hwc);
    s.out_dtype = to_dtype(out_dtype);
    s.out = to_dims(out, hwc);
    s.param_offset = offset;
    s.rects = rects;
    s.pad = std::string(pad);
    s.channels = channels;
    s.mode = static_cast<transforms::ConvertMode>(mode);
    s.scale = static_cast<float>(scale);
    for (double v : mean) s.mean.push_back(static_cast<float>(v));
    for (double v : std) s.std.push_back(static_cast<float>(v));
    steps.push_back(std::move(s));
  }
  std::vector<uint64_t> decoded;
  for (const FieldSpec& f : specs) decoded.push_back(f.decoded_bytes);
  return std::make_shared<const TransformPipeline>(std::move(steps), decoded, num_params);
}

}  // namespace fastload::bindings
