// Record and payload decoding for Python: one record (decode_record), and the
// single-thread floors the benchmarks compare the reader with (decode_records,
// library_decode); the field description every binding file parses (to_specs).
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "checked_math.h"
#include "errors.h"
#include "format/record_decoder.h"
#include "reader/floors.h"

namespace fastload::bindings {

std::vector<FieldSpec> to_specs(const std::vector<FieldTuple>& fields) {
  std::vector<FieldSpec> specs;
  for (const py::tuple& t : fields) {
    if (t.size() != 3 && t.size() != 4 && t.size() != 8) {
      throw py::value_error("a field is (codec id, itemsize, decoded bytes[, bool[, height, width, channels, planar]])");
    }
    const auto codec = t[0].cast<int>();
    if (codec < 0 || codec > kLastCodec) {
      throw py::value_error("unknown codec id " + std::to_string(codec));
    }
    const bool boolean = t.size() == 4 && t[3].cast<bool>();
    ImageGeometry image;
    if (t.size() == 8) {
      image = ImageGeometry{t[4].cast<uint32_t>(), t[5].cast<uint32_t>(), t[6].cast<uint32_t>(), t[7].cast<bool>()};
    }
    specs.push_back(FieldSpec{static_cast<Codec>(codec), t[1].cast<uint32_t>(), t[2].cast<uint64_t>(), boolean, image});
  }
  return specs;
}

// One compiled transform step, as fastload.transforms.Step.native() builds it:

namespace {

void decode_record(const py::buffer& record, const std::vector<FieldTuple>& fields, const std::vector<py::buffer>& out,
                   bool verify, uint16_t version, uint64_t fingerprint, std::optional<uint64_t> key) {
  if (out.size() != fields.size()) throw py::value_error("decode_record: one output buffer per field");
  auto specs = to_specs(fields);
  // Checks the schema (sizes, bound) before any buffer is looked at.
  RecordDecoder decoder(specs, DecoderOptions{verify, kDefaultMaxSampleBytes, version, fingerprint});
  py::buffer_info in = record.request();
  std::vector<py::buffer_info> infos;
  std::vector<uint8_t*> dest;
  for (size_t f = 0; f < out.size(); ++f) {
    infos.push_back(out[f].request(true));
    if (static_cast<uint64_t>(infos.back().size * infos.back().itemsize) != specs[f].decoded_bytes) {
      throw py::value_error("decode_record: output buffer " + std::to_string(f) + " has the wrong size");
    }
    dest.push_back(static_cast<uint8_t*>(infos.back().ptr));
  }
  const GilRelease release;
  try {
    decoder.decode(static_cast<const uint8_t*>(in.ptr), static_cast<size_t>(in.size * in.itemsize), dest.data(),
                   key.value_or(kAnyKey));
  } catch (const DecodeError& e) {
    throw CorruptRecordError("<buffer>", 0, e.what());
  }
}

void decode_records(const py::buffer& blob, const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& offsets,
                    const std::vector<FieldTuple>& fields, const std::vector<py::buffer>& out, bool verify,
                    uint16_t version, uint64_t fingerprint) {
  auto specs = to_specs(fields);
  if (out.size() != specs.size()) throw py::value_error("decode_records: one output buffer per field");
  if (offsets.size() < 1) throw py::value_error("decode_records: offsets needs at least one entry");
  py::buffer_info in = blob.request();
  const auto blob_size = static_cast<uint64_t>(in.size * in.itemsize);
  std::vector<uint64_t> bounds(offsets.data(), offsets.data() + offsets.size());
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] > blob_size || (i > 0 && bounds[i] < bounds[i - 1])) {
      throw py::value_error("decode_records: offsets must be non-decreasing and within the blob");
    }
  }
  const uint64_t count = bounds.size() - 1;
  std::vector<py::buffer_info> infos;
  std::vector<uint8_t*> dest;
  for (size_t f = 0; f < out.size(); ++f) {
    infos.push_back(out[f].request(true));
    uint64_t needed = 0;
    if (!checked_mul(count, specs[f].decoded_bytes, &needed)) {
      throw py::value_error("decode_records: " + std::to_string(count) + " records of field " + std::to_string(f) +
                            " (" + std::to_string(specs[f].decoded_bytes) + " bytes each): size overflow");
    }
    if (static_cast<uint64_t>(infos.back().size * infos.back().itemsize) < needed) {
      throw py::value_error("decode_records: output buffer " + std::to_string(f) + " is too small");
    }
    dest.push_back(static_cast<uint8_t*>(infos.back().ptr));
  }
  const GilRelease release;
  decode_all(static_cast<const uint8_t*>(in.ptr), bounds, specs, dest,
             DecoderOptions{verify, kDefaultMaxSampleBytes, version, fingerprint});
}

void library_decode(int codec, const py::buffer& blob,
                    const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& offsets,
                    const py::buffer& out, size_t decoded_bytes, uint32_t height, uint32_t width, uint32_t channels) {
  if (codec < 0 || codec > kLastCodec) throw py::value_error("unknown codec id " + std::to_string(codec));
  if (offsets.size() < 1) throw py::value_error("library_decode: offsets needs at least one entry");
  py::buffer_info in = blob.request();
  py::buffer_info dst = out.request(true);
  const auto blob_size = static_cast<uint64_t>(in.size * in.itemsize);
  std::vector<uint64_t> bounds(offsets.data(), offsets.data() + offsets.size());
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (bounds[i] > blob_size || (i > 0 && bounds[i] < bounds[i - 1])) {
      throw py::value_error("library_decode: offsets must be non-decreasing and within the blob");
    }
  }
  uint64_t needed = 0;
  if (!checked_mul(static_cast<uint64_t>(bounds.size() - 1), static_cast<uint64_t>(decoded_bytes), &needed) ||
      static_cast<uint64_t>(dst.size * dst.itemsize) < needed) {
    throw py::value_error("library_decode: output buffer too small");
  }
  if (codec == static_cast<int>(Codec::kPng) || codec == static_cast<int>(Codec::kJpeg)) {
    uint64_t bytes = 0;
    if (!checked_mul(uint64_t{height} * width, uint64_t{channels}, &bytes) || bytes > decoded_bytes ||
        decoded_bytes % bytes != 0 || decoded_bytes / bytes > 2) {
      throw py::value_error("library_decode: image geometry disagrees with decoded_bytes");
    }
  }
  const GilRelease release;
  library_decode_all(static_cast<Codec>(codec), static_cast<const uint8_t*>(in.ptr), bounds,
                     static_cast<uint8_t*>(dst.ptr), decoded_bytes, ImageGeometry{height, width, channels, false});
}

}  // namespace

void register_codecs(py::module_& m) {
  m.def(
      "checksum", [](const py::buffer& b) {
        py::buffer_info info = b.request();
        return checksum(info.ptr, static_cast<size_t>(info.size * info.itemsize));
      },
      py::arg("data"), "XXH3-64 (seed 0) of a buffer's bytes: the record checksum.");
  m.def("decode_record", &decode_record, py::arg("record"), py::arg("fields"), py::arg("out"),
        py::arg("verify") = true, py::arg("version") = kRecordVersion, py::arg("fingerprint") = 0,
        py::arg("key") = py::none(),
        "Decodes one record into one writable buffer per field (v2, v3: checks the fingerprint, and the key if given).");
  m.def("decode_records", &decode_records, py::arg("blob"), py::arg("offsets"), py::arg("fields"), py::arg("out"),
        py::arg("verify") = true, py::arg("version") = kRecordVersion, py::arg("fingerprint") = 0,
        "Decodes records laid end to end in one thread (a benchmark floor; keys are not checked).");
  m.def("library_decode", &library_decode, py::arg("codec"), py::arg("blob"), py::arg("offsets"), py::arg("out"),
        py::arg("decoded_bytes"), py::arg("height") = 0, py::arg("width") = 0, py::arg("channels") = 0,
        "Decodes payloads laid end to end with the codec's library alone, one thread (a benchmark floor).");
  m.attr("RECORD_MAGIC") = kRecordMagic;
  m.attr("RECORD_VERSION") = kRecordVersion;
  m.attr("DEFAULT_MAX_SAMPLE_BYTES") = kDefaultMaxSampleBytes;
}

}  // namespace fastload::bindings
