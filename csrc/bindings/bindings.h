// What the binding files (csrc/bindings/*.cpp) share: the pybind11 namespace,
// how Python describes a field and a transform step, and one registration
// function per area, called in order by module.cpp (the module's one entry
// point):
//   errors.cpp      the C++ error classes as fastload.errors' typed exceptions
//   order.cpp       the epoch order (permutation, permutation_at, mix64)
//   codecs.cpp      record and payload decoding (decode_record, the floors)
//   shards.cpp      shard files: ShardSet, ShardRecords, validate_shard
//   reader.cpp      the batch worker pool: BatchReader, SlotPool, SlotLease
//   warmer.cpp      the Warmer: a loader's first memory touched in the background
//   transforms.cpp  transform steps as Python describes them -> a TransformPipeline
// Rules every file follows (the GIL, interpreter exit, fork): module.cpp.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/exit_gate.h"
#include "format/record_decoder.h"
#include "transforms/pipeline.h"

namespace fastload::bindings {

namespace py = pybind11;
using exit_gate::GilRelease;

// (codec id, itemsize, decoded bytes[, is bool[, height, width, channels, planar]]):
// one field as Python describes it (the image geometry for png and jpeg).
using FieldTuple = py::tuple;

std::vector<FieldSpec> to_specs(const std::vector<FieldTuple>& fields);

// (kind, field, in dtype, in (c, h, w), hwc, out dtype, out (c, h, w), param
// offset, pad or fill bytes, channels, convert mode, scale, mean, std, rectangles).
using StepTuple = std::tuple<int, size_t, int, std::vector<int64_t>, bool, int, std::vector<int64_t>, size_t,
                             py::bytes, std::vector<int64_t>, int, double, std::vector<double>, std::vector<double>,
                             size_t>;

// The pipeline of `tuples` over fields `specs` (null when there is nothing to run).
std::shared_ptr<const TransformPipeline> to_pipeline(const std::vector<StepTuple>& tuples,
                                                     const std::vector<FieldSpec>& specs, size_t num_params);

void register_errors(py::module_& m);
void register_order(py::module_& m);
void register_codecs(py::module_& m);
void register_shards(py::module_& m);
void register_reader(py::module_& m);
void register_warmer(py::module_& m);

}  // namespace fastload::bindings
