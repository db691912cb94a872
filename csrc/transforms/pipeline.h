// TransformPipeline: the compiled transform chain of a loader (docs/TRANSFORMS.md),
// run by BatchReader's workers on each decoded sample.
//
// Python (fastload.transforms.Program) compiles the ops into steps, one kernel
// on one field each, and draws every random parameter per sample; this class
// validates the steps once (sizes, dtypes, parameter offsets, channel indices)
// and then runs a field's steps on one sample, from the decoded bytes to its
// row of the batch slot, through two per-thread scratch buffers.
//
// Thread safety: immutable after construction; run() may be called from any
// number of threads, each with its own scratch. The constructor throws
// FastloadError naming the bad step; run() does not throw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "transforms/kernels.h"

namespace fastload {

struct TransformStep {
  enum Kind : uint8_t { kGather = 0, kSelect = 1, kConvert = 2, kFill = 3, kResize = 4 };
  uint8_t kind = kGather;
  size_t field = 0;
  transforms::DType in_dtype = transforms::DType::kU8;
  transforms::Dims in;
  transforms::DType out_dtype = transforms::DType::kU8;
  transforms::Dims out;
  size_t param_offset = 0;        // gather: six int64 at this offset of the sample's parameters; fill: 4 per rect
  std::string pad;                // gather: one item of in_dtype; fill: the value
  size_t rects = 0;               // fill: rectangles per sample
  std::vector<int64_t> channels;  // select
  transforms::ConvertMode mode = transforms::ConvertMode::kScale;  // convert; resize: 1 bilinear, 0 nearest
  float scale = 1.0f;
  std::vector<float> mean, std;
};

class TransformPipeline {
 public:
  // decoded_bytes: per field of the schema, its decoded size. Throws
  // FastloadError when a step does not fit its field or the step before it.
  TransformPipeline(std::vector<TransformStep> steps, const std::vector<uint64_t>& decoded_bytes, size_t num_params);

  size_t num_params() const noexcept { return num_params_; }
  size_t field_count() const noexcept { return per_field_.size(); }
  bool transforms(size_t field) const { return !per_field_.at(field).empty(); }
  uint64_t in_bytes(size_t field) const { return in_bytes_.at(field); }
  // Bytes of one transformed sample of `field` (its decoded size without steps).
  uint64_t out_bytes(size_t field) const { return out_bytes_.at(field); }
  // The largest intermediate result of any step: the scratch size run() needs.
  size_t scratch_bytes() const noexcept { return scratch_bytes_; }

  // Runs field `field`'s steps on one sample: src (decoded) to dst
  // (out_bytes(field)), with the sample's `params`; a and b are scratch of
  // scratch_bytes() each.
  void run(size_t field, const uint8_t* src, uint8_t* dst, const int64_t* params, uint8_t* a, uint8_t* b) const;

 private:
  std::vector<std::vector<TransformStep>> per_field_;
  std::vector<uint64_t> in_bytes_, out_bytes_;
  size_t num_params_;
  size_t scratch_bytes_ = 0;
};

}  // namespace fastload
