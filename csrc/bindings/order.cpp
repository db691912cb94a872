// The epoch order (docs/ORDER.md): permutation slices and lookups, SplitMix64.
#include <cstddef>
#include <cstdint>
#include <string>

#include "bindings/bindings.h"
#include "reader/permutation.h"

namespace fastload::bindings {
namespace {

py::array_t<uint64_t> permutation_at(uint64_t seed, uint64_t epoch, uint64_t n,
                                     const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& positions) {
  const uint64_t* src = positions.data();
  const auto count = static_cast<size_t>(positions.size());
  for (size_t i = 0; i < count; ++i) {
    if (src[i] >= n) throw py::value_error("permutation_at: position " + std::to_string(src[i]) + " >= n");
  }
  py::array_t<uint64_t> out(static_cast<py::ssize_t>(count));
  uint64_t* dst = out.mutable_data();
  {
    const GilRelease release;
    const Permutation perm(seed, epoch, n);
    for (size_t i = 0; i < count; ++i) dst[i] = perm(src[i]);
  }
  return out;
}

py::array_t<uint64_t> permutation_slice(uint64_t seed, uint64_t epoch, uint64_t n, uint64_t start, uint64_t count) {
  if (start > n || count > n - start) throw py::value_error("permutation: [start, start + count) exceeds n");
  py::array_t<uint64_t> out(static_cast<py::ssize_t>(count));
  uint64_t* dst = out.mutable_data();
  {
    const GilRelease release;
    const Permutation perm(seed, epoch, n);
    for (uint64_t i = 0; i < count; ++i) dst[i] = perm(start + i);
  }
  return out;
}

}  // namespace

void register_order(py::module_& m) {
  m.def("permutation", &permutation_slice, py::arg("seed"), py::arg("epoch"), py::arg("n"), py::arg("start"),
        py::arg("count"), "Positions [start, start+count) of the epoch order (docs/ORDER.md, v1).");
  m.def("permutation_at", &permutation_at, py::arg("seed"), py::arg("epoch"), py::arg("n"), py::arg("positions"),
        "The samples at the given positions of the epoch order (docs/ORDER.md, v1).");
  m.def("mix64", &mix64, py::arg("z"), "SplitMix64's finaliser, as used by the epoch order.");
}

}  // namespace fastload::bindings
