// Shard files for Python: ShardSet (the native loader's), ShardRecords (the
// Python readers': ShardDataset, backend="torch", fastload verify),
// validate_shard, and the lookup floor.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "checked_math.h"
#include "errors.h"
#include "format/record_blocks.h"
#include "format/record_decoder.h"
#include "platform/file_mapping.h"
#include "reader/floors.h"
#include "reader/shard_reader.h"

namespace fastload::bindings {
namespace {

// One shard's records for the Python readers (ShardDataset, and so backend="torch"; fastload verify): the
// native validation walk, mapping, shrink guard and decoders, so that every reader accepts and refuses the
// same bytes (one png, jpeg, zstd and lz4 decoder, one bound on what a payload may inflate to) and a shard
// that shrinks while read is a CorruptShardError, never SIGBUS. Any number of threads may share the object:
// a call takes the kept decoder when it is free and makes one of its own when not (so a fork child whose
// parent was decoding on another thread never waits on a lock nobody will release).
class PyShardRecords {
 public:
  PyShardRecords(const std::string& path, uint64_t count, const std::vector<FieldTuple>& fields, bool verify,
                 uint16_t version, uint64_t fingerprint, uint64_t max_sample_bytes)
      : specs_(to_specs(fields)), options_{verify, max_sample_bytes, version, fingerprint} {
    const GilRelease release;
    decoder_ = std::make_unique<RecordDecoder>(specs_, options_);  // checks the schema before the file is mapped
    file_ = std::make_unique<ShardFile>(path, count, version >= kBlockVersion);  // v4: records in blocks
  }

  uint64_t size() const noexcept { return file_->records(); }
  const std::string& path() const noexcept { return file_->path(); }

  // Decodes record keys[i] into row rows[i] of out[f] (a writable buffer of rows of the field's decoded
  // bytes; None skips the field: validated, not decoded or verified).
  void decode_rows(const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& keys,
                   const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& rows,
                   const std::vector<std::optional<py::buffer>>& out) {
    if (out.size() != specs_.size()) throw py::value_error("decode_rows: one output (or None) per field");
    if (keys.ndim() != 1 || rows.ndim() != 1 || keys.size() != rows.size()) {
      throw py::value_error("decode_rows: keys and rows must be 1-D and of one length");
    }
    const std::vector<uint64_t> key_list(keys.data(), keys.data() + keys.size());
    const std::vector<uint64_t> row_list(rows.data(), rows.data() + rows.size());
    uint64_t row_count = 0;
    for (uint64_t r : row_list) {
      if (r == UINT64_MAX) throw py::value_error("decode_rows: row out of range");
      row_count = std::max(row_count, r + 1);
    }
    std::vector<py::buffer_info> infos(out.size());
    std::vector<uint8_t*> base(out.size(), nullptr);
    for (size_t f = 0; f < out.size(); ++f) {
      if (!out[f]) continue;
      infos[f] = out[f]->request(true);
      uint64_t needed = 0;
      if (!checked_mul(row_count, specs_[f].decoded_bytes, &needed) ||
          static_cast<uint64_t>(infos[f].size * infos[f].itemsize) < needed) {
        throw py::value_error("decode_rows: output buffer " + std::to_string(f) + " is too small");
      }
      base[f] = static_cast<uint8_t*>(infos[f].ptr);
    }
    const GilRelease release;
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    std::unique_ptr<RecordDecoder> own;
    if (!lock.owns_lock()) own = std::make_unique<RecordDecoder>(specs_, options_);
    RecordDecoder& decoder = own ? *own : *decoder_;
    std::vector<uint8_t*> dest(specs_.size());
    for (size_t i = 0; i < key_list.size(); ++i) {
      const uint64_t key = key_list[i];
      for (size_t f = 0; f < specs_.size(); ++f) {
        dest[f] = base[f] == nullptr ? nullptr : base[f] + row_list[i] * specs_[f].decoded_bytes;
      }
      try {
        const MappedReadScope reading(file_->mapping());
        const auto [data, bytes] = file_->record(key);
        decoder.decode(data, bytes, dest.data(), key, options_.schema_fingerprint);
      } catch (const DecodeError& err) {
        file_->check_unchanged_after_error();
        throw CorruptRecordError(file_->path(), key, err.what());
      }
      file_->check_unchanged();
    }
  }

 private:
  std::vector<FieldSpec> specs_;
  std::unique_ptr<RecordDecoder> decoder_;
  std::unique_ptr<ShardFile> file_;
  DecoderOptions options_;
  std::mutex mutex_;  // held while decoder_ is in use
};

uint64_t lookup_records(const ShardSet& shards, const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& indices) {
  std::vector<uint64_t> copy(indices.data(), indices.data() + indices.size());
  for (uint64_t index : copy) {
    if (index >= shards.total_records()) throw py::index_error("lookup_records: index out of range");
  }
  const GilRelease release;
  return lookup_all(shards, copy);
}

}  // namespace

void register_shards(py::module_& m) {
  py::class_<ShardSet, std::shared_ptr<ShardSet>>(m, "ShardSet", "The shards of one dataset, mapped and validated.")
      .def(py::init([](const std::vector<std::string>& paths, const std::vector<uint64_t>& counts,
                       const std::vector<bool>& packed) {
             const GilRelease release;
             return std::make_shared<ShardSet>(paths, counts, packed);
           }),
           py::arg("paths"), py::arg("counts"), py::arg("packed"))
      .def_static(
          "lazy",
          [](const std::vector<uint64_t>& counts, const std::vector<bool>& packed) {
            return std::make_shared<ShardSet>(counts, packed);
          },
          py::arg("counts"), py::arg("packed"),
          "Return a set of shards of these record counts, none opened yet: attach() opens each.")
      .def(
          "attach",
          [](ShardSet& self, size_t index, const std::string& path) {
            const GilRelease release;
            self.attach(index, path);
          },
          py::arg("index"), py::arg("path"),
          "Open and validate ``path`` as shard ``index`` (once; a second attach keeps the first).")
      .def("attached", &ShardSet::attached, py::arg("index"), "Return whether shard ``index`` is attached.")
      .def(
          "detach",
          [](ShardSet& self, size_t index) {
            const GilRelease release;
            return self.detach(index);
          },
          py::arg("index"),
          "Close shard ``index`` (a lazy set's) unless a batch in flight reads it; return whether it is closed.")
      .def("__len__", &ShardSet::size)
      .def_property_readonly("total_records", &ShardSet::total_records);

  py::class_<PyShardRecords>(m, "ShardRecords",
                             "One shard's records, validated, mapped and decoded natively (the Python readers).")
      .def(py::init<const std::string&, uint64_t, const std::vector<FieldTuple>&, bool, uint16_t, uint64_t,
                    uint64_t>(),
           py::arg("path"), py::arg("count"), py::arg("fields"), py::arg("verify") = true,
           py::arg("version") = kRecordVersion, py::arg("fingerprint") = 0,
           py::arg("max_sample_bytes") = kDefaultMaxSampleBytes)
      .def("__len__", &PyShardRecords::size)
      .def_property_readonly("path", &PyShardRecords::path)
      .def("decode_rows", &PyShardRecords::decode_rows, py::arg("keys"), py::arg("rows"), py::arg("out"),
           "Decodes record keys[i] into row rows[i] of each field's buffer (None skips a field).");

  m.def("lookup_records", &lookup_records, py::arg("shards"), py::arg("indices"),
        "Looks records up in the shards in one thread without decoding; returns their total bytes (a floor).");
  m.def(
      "validate_shard",
      [](const std::string& path, uint64_t expected_records, bool packed) {
        ShardLayout layout;
        {
          const GilRelease release;
          layout = validate_shard_file(path, expected_records, packed);
        }
        py::dict out;
        out["page_size"] = layout.page_size;
        out["last_page"] = layout.last_page;
        out["depth"] = layout.depth;
        out["branch_pages"] = layout.branch_pages;
        out["leaf_pages"] = layout.leaf_pages;
        out["overflow_pages"] = layout.overflow_pages;
        return out;
      },
      py::arg("path"), py::arg("expected_records"), py::arg("packed") = false,
      "Validates a shard file's whole LMDB structure, and with packed (format v4) its blocks (CorruptShardError if "
      "unsound); returns a summary.");
}

}  // namespace fastload::bindings
