// The only file that knows Python: pybind11 bindings of the fastload core.
//
// Note on the GIL: with the GIL held we parse arguments and take pointers and
// sizes from buffers; then one GIL-release scope (GilRelease) does the C++ work
// and touches no Python object; then results are built with the GIL back.
// Waiting for a batch releases the GIL in slices of kSignalPollMs so that
// Ctrl-C (PyErr_CheckSignals) interrupts a wait promptly.
//
// Python objects kept alive by C++ (batch buffers handed in by Python) are
// held through GilObject, whose destructor takes the GIL before the decref.
//
// Lifecycle rules of a BatchReader (see PyBatchReader):
// - one consumer: next() and submit() from a second thread while one is inside
//   them raise FastloadError instead of racing on the batch queue;
// - interpreter exit: no thread takes the GIL back through this module once
//   the interpreter has begun to exit, except the finalizing one (CPython
//   would end it with pthread_exit, whose unwinding through a destructor
//   aborts the process): every GIL release here is an exit_gate::GilRelease
//   (never py::gil_scoped_release), every GIL taken from another thread an
//   exit_gate::GilForThisThread; see exit_gate.h;
// - os.fork(): the child inherits the reader but not its worker threads, whose
//   mutexes may even be held. Every use in the child raises FastloadError, and
//   close() or destruction there abandons the reader (leaks it) rather than
//   locking or joining anything.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings/exit_gate.h"
#include "checked_math.h"
#include "errors.h"
#include "format/record_decoder.h"
#include "reader/batch_reader.h"
#include "reader/floors.h"
#include "reader/permutation.h"
#include "reader/shard_reader.h"
#include "transforms/pipeline.h"

namespace py = pybind11;
using namespace fastload;
using fastload::exit_gate::GilRelease;

namespace {

constexpr int kSignalPollMs = 50;

// (codec id, itemsize, decoded bytes[, is bool[, height, width, channels, planar]]):
// one field as Python describes it (the image geometry for png and jpeg).
using FieldTuple = py::tuple;

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
// (kind, field, in dtype, in (c, h, w), hwc, out dtype, out (c, h, w), param
// offset, pad or fill bytes, channels, convert mode, scale, mean, std, rectangles).
using StepTuple = std::tuple<int, size_t, int, std::vector<int64_t>, bool, int, std::vector<int64_t>, size_t,
                             py::bytes, std::vector<int64_t>, int, double, std::vector<double>, std::vector<double>,
                             size_t>;

transforms::Dims to_dims(const std::vector<int64_t>& chw, bool hwc) {
  if (chw.size() != 3) throw py::value_error("a transform step's sizes are (channels, height, width)");
  return transforms::Dims{chw[0], chw[1], chw[2], hwc};
}

transforms::DType to_dtype(int code) {
  if (code < 0 || code > transforms::kMaxDType) throw py::value_error("unknown dtype code " + std::to_string(code));
  return static_cast<transforms::DType>(code);
}

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

// Holds a Python object from C++; safe to destroy on any thread. Once the
// interpreter is exiting, a thread other than the finalizing one leaks the
// object rather than take the GIL.
struct GilObject {
  py::object obj;
  explicit GilObject(py::object o) : obj(std::move(o)) {}
  ~GilObject() {
    const exit_gate::GilForThisThread gil;
    if (!gil.held()) {
      static_cast<void>(obj.release());
      return;
    }
    py::object drop = std::move(obj);
  }
};

// The numpy base of a delivered batch: the slot returns to the pool when the
// last array (and so the last tensor) viewing it is gone.
struct SlotLease {
  std::shared_ptr<Slot> slot;
};

// Marks the single consumer of a reader as busy for one call.
class ConsumerGuard {
 public:
  explicit ConsumerGuard(std::atomic<bool>& busy, const char* what) : busy_(busy) {
    if (busy_.exchange(true)) {
      throw FastloadError(std::string("BatchReader.") + what +
                          ": another thread is using this reader; a loader iterator belongs to one thread at a time");
    }
  }
  ~ConsumerGuard() { busy_.store(false); }
  ConsumerGuard(const ConsumerGuard&) = delete;
  ConsumerGuard& operator=(const ConsumerGuard&) = delete;

 private:
  std::atomic<bool>& busy_;
};

// A BatchReader plus the Python-side description of its fields.
class PyBatchReader {
 public:
  PyBatchReader(std::shared_ptr<const ShardSet> shards, const std::vector<FieldTuple>& fields,
                std::vector<py::dtype> dtypes, std::vector<std::vector<py::ssize_t>> shapes, std::vector<bool> decode,
                size_t batch_capacity, size_t num_threads, bool verify,
                const std::vector<StepTuple>& steps, size_t num_params, uint64_t max_sample_bytes,
                uint16_t record_version, uint64_t schema_fingerprint, std::vector<uint64_t> shard_fingerprints,
                std::shared_ptr<SlotPool> pool)
      : dtypes_(std::move(dtypes)), shapes_(std::move(shapes)), num_params_(num_params) {
    if (dtypes_.size() != fields.size() || shapes_.size() != fields.size() || decode.size() != fields.size()) {
      throw py::value_error("fields, dtypes, shapes and decode differ in length");
    }
    if (batch_capacity == 0) throw py::value_error("batch_capacity must be positive");
    if (num_threads == 0) throw py::value_error("num_threads must be positive");
    auto specs = to_specs(fields);
    ReaderOptions options{batch_capacity, num_threads, verify, std::move(decode),
                          to_pipeline(steps, specs, num_params)};
    options.max_sample_bytes = max_sample_bytes;
    options.record_version = record_version;
    options.schema_fingerprint = schema_fingerprint;
    options.shard_fingerprints = std::move(shard_fingerprints);
    options.pool = std::move(pool);
    {
      const GilRelease release;
      reader_ = std::make_unique<BatchReader>(std::move(shards), std::move(specs), std::move(options));
    }
    for (size_t f = 0; f < dtypes_.size(); ++f) {  // the arrays next() builds must lie inside their field's area
      uint64_t bytes = static_cast<uint64_t>(dtypes_[f].itemsize());
      for (py::ssize_t d : shapes_[f]) {
        if (d < 0 || !checked_mul(bytes, static_cast<uint64_t>(d), &bytes)) bytes = UINT64_MAX;
      }
      if (bytes != reader_->sample_bytes(f)) {
        const size_t expected = reader_->sample_bytes(f);
        reader_.reset();
        throw py::value_error("BatchReader: field " + std::to_string(f) + "'s shape and dtype make " +
                              std::to_string(bytes) + " bytes, its decoded size is " + std::to_string(expected));
      }
    }
  }

  ~PyBatchReader() {
    if (forked()) {
      abandon();
      return;
    }
    const GilRelease release;
    reader_.reset();
  }

  bool forked() const noexcept { return ::getpid() != owner_pid_; }

  BatchReader& reader() {
    if (forked()) {
      throw FastloadError("this reader was created in process " + std::to_string(owner_pid_) +
                          " and inherited through os.fork(); its threads do not exist here: build a new loader "
                          "in the child");
    }
    if (!reader_) throw FastloadError("the reader is closed");
    return *reader_;
  }

  void add_slot(const py::buffer& buffer, bool reusable) {
    py::buffer_info info = buffer.request(true);
    const auto bytes = static_cast<size_t>(info.size * info.itemsize);
    if (info.ndim != 1 || info.strides[0] != info.itemsize) {
      throw py::value_error("add_slot: the buffer must be one-dimensional and contiguous");
    }
    reader().pool()->add(static_cast<uint8_t*>(info.ptr), bytes, std::make_shared<GilObject>(buffer), reusable);
  }

  // One buffer per field (None for a field not decoded), kept alive together.
  void add_split_slot(const py::list& buffers, bool reusable) {
    std::vector<std::pair<uint8_t*, size_t>> spans;
    for (const py::handle item : buffers) {
      if (item.is_none()) {
        spans.emplace_back(nullptr, 0);
        continue;
      }
      py::buffer_info info = py::reinterpret_borrow<py::buffer>(item).request(true);
      if (info.ndim != 1 || info.strides[0] != info.itemsize) {
        throw py::value_error("add_split_slot: every buffer must be one-dimensional and contiguous");
      }
      spans.emplace_back(static_cast<uint8_t*>(info.ptr), static_cast<size_t>(info.size * info.itemsize));
    }
    reader().add_split_slot(spans, std::make_shared<GilObject>(buffers), reusable);
  }

  // params: [len(indices), num_params] int64, or None without transform parameters.
  void submit(const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& indices,
              const std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>& params) {
    std::vector<uint64_t> copy(indices.data(), indices.data() + indices.size());
    std::vector<int64_t> values;
    if (params) {
      if (params->ndim() != 2 || static_cast<size_t>(params->shape(1)) != num_params_ ||
          params->shape(0) != indices.size()) {
        throw py::value_error("submit: params must have shape [" + std::to_string(indices.size()) + ", " +
                              std::to_string(num_params_) + "]");
      }
      values.assign(params->data(), params->data() + params->size());
    }
    BatchReader& r = reader();
    const ConsumerGuard guard(busy_, "submit");
    const GilRelease release;
    r.submit(std::move(copy), std::move(values));
  }

  CompletedBatch wait() {
    BatchReader& r = reader();
    const ConsumerGuard guard(busy_, "next");
    std::optional<CompletedBatch> batch;
    while (!batch) {
      std::exception_ptr error;
      PyThreadState* state = PyEval_SaveThread();
      try {
        batch = r.wait_next(std::chrono::milliseconds(kSignalPollMs));
      } catch (...) {
        error = std::current_exception();
      }
      exit_gate::restore_or_park(state);
      if (error) std::rethrow_exception(error);
      if (!batch && PyErr_CheckSignals() != 0) throw py::error_already_set();
    }
    return std::move(*batch);
  }

  // The oldest batch's sample count, its slot released: for callers that view
  // the (single-use) slot memory they added themselves.
  size_t next_count() { return wait().count; }

  size_t field_count() const { return dtypes_.size(); }

  std::vector<size_t> field_offsets() {
    BatchReader& r = reader();
    std::vector<size_t> offsets;
    for (size_t f = 0; f < dtypes_.size(); ++f) {
      if (r.decodes_field(f)) offsets.push_back(r.field_offset(f));
    }
    return offsets;
  }

  py::list next() {
    BatchReader& r = reader();
    const CompletedBatch batch = wait();
    py::object base = py::cast(SlotLease{batch.slot});
    py::list arrays;
    for (size_t f = 0; f < dtypes_.size(); ++f) {
      if (!r.decodes_field(f)) continue;
      std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(batch.count)};
      shape.insert(shape.end(), shapes_[f].begin(), shapes_[f].end());
      uint8_t* data = batch.slot->field_data.empty() ? batch.slot->data + r.field_offset(f) : batch.slot->field_data[f];
      arrays.append(py::array(dtypes_[f], shape, {}, data, base));
    }
    return arrays;
  }

  void close() {
    if (!reader_) return;
    if (forked()) {
      abandon();
      return;
    }
    const GilRelease release;
    reader_->close();
  }

 private:
  // In a forked child: the worker threads are the parent's and may have held
  // the reader's mutexes at the fork, so neither lock nor join; leak instead.
  void abandon() noexcept { static_cast<void>(reader_.release()); }

  std::vector<py::dtype> dtypes_;
  std::vector<std::vector<py::ssize_t>> shapes_;
  size_t num_params_ = 0;
  std::unique_ptr<BatchReader> reader_;
  pid_t owner_pid_ = ::getpid();
  std::atomic<bool> busy_{false};
};

py::dict stats_dict(const ReaderStats& s) {
  py::dict d;
  d["batches"] = s.batches;
  d["samples"] = s.samples;
  d["bytes_read"] = s.bytes_read;
  d["bytes_decoded"] = s.bytes_decoded;
  d["read_s"] = static_cast<double>(s.read_ns) * 1e-9;
  d["decompress_s"] = static_cast<double>(s.decompress_ns) * 1e-9;
  d["copy_s"] = static_cast<double>(s.decode_ns - std::min(s.decode_ns, s.decompress_ns)) * 1e-9;
  d["wait_s"] = static_cast<double>(s.wait_ns) * 1e-9;
  d["transform_s"] = static_cast<double>(s.transform_ns) * 1e-9;
  return d;
}

void raise_typed(const char* class_name, py::tuple args) {
  py::object cls = py::module_::import("fastload.errors").attr(class_name);
  py::object err = cls(*args);
  PyErr_SetObject(cls.ptr(), err.ptr());
}

void register_errors() {
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CorruptRecordError& e) {
      raise_typed("CorruptRecordError", py::make_tuple(e.path(), e.record(), e.reason()));
    } catch (const ShardNotFoundError& e) {
      raise_typed("ShardNotFoundError", py::make_tuple(e.path()));
    } catch (const CorruptShardError& e) {
      raise_typed("CorruptShardError", py::make_tuple(e.path(), std::string(e.what())));
    } catch (const FastloadError& e) {
      raise_typed("FastloadError", py::make_tuple(std::string(e.what())));
    }
  });
}

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
    file_ = std::make_unique<ShardFile>(path, count);
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
      const auto [data, bytes] = file_->record(key);
      try {
        const MappedReadScope reading(file_->mapping());
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

PYBIND11_MODULE(_native, m) {
  m.doc() = "fastload's native core: LMDB shard reading, record decoding and the batch worker pool.";
  register_errors();
  // Interpreter exit and fork: exit_gate.h. atexit runs its callbacks last registered first: multiprocessing's,
  // which terminates daemonic children (torch DataLoader workers a pass is reading from), is registered first so
  // that it runs after the gate has parked the threads reading from them.
  py::module_::import("multiprocessing.util");
  py::module_::import("atexit").attr("register")(py::cpp_function([] { exit_gate::begin_exit(); }));
  py::module_::import("os").attr("register_at_fork")(
      py::arg("after_in_child") = py::cpp_function([] { exit_gate::after_fork_in_child(); }));
  Py_AtExit(&exit_gate::interpreter_gone);

  m.def(
      "checksum", [](const py::buffer& b) {
        py::buffer_info info = b.request();
        return checksum(info.ptr, static_cast<size_t>(info.size * info.itemsize));
      },
      py::arg("data"), "XXH3-64 (seed 0) of a buffer's bytes: the record checksum.");
  m.def("permutation", &permutation_slice, py::arg("seed"), py::arg("epoch"), py::arg("n"), py::arg("start"),
        py::arg("count"), "Positions [start, start+count) of the epoch order (docs/ORDER.md, v1).");
  m.def("permutation_at", &permutation_at, py::arg("seed"), py::arg("epoch"), py::arg("n"), py::arg("positions"),
        "The samples at the given positions of the epoch order (docs/ORDER.md, v1).");
  m.def("mix64", &mix64, py::arg("z"), "SplitMix64's finaliser, as used by the epoch order.");
  m.def("decode_record", &decode_record, py::arg("record"), py::arg("fields"), py::arg("out"),
        py::arg("verify") = true, py::arg("version") = kRecordVersion, py::arg("fingerprint") = 0,
        py::arg("key") = py::none(),
        "Decodes one record into one writable buffer per field (v2, v3: checks the fingerprint, and the key if given).");
  m.def("decode_records", &decode_records, py::arg("blob"), py::arg("offsets"), py::arg("fields"), py::arg("out"),
        py::arg("verify") = true, py::arg("version") = kRecordVersion, py::arg("fingerprint") = 0,
        "Decodes records laid end to end in one thread (a benchmark floor; keys are not checked).");
  m.def("lookup_records", &lookup_records, py::arg("shards"), py::arg("indices"),
        "Looks records up in the shards in one thread without decoding; returns their total bytes (a floor).");
  m.def(
      "validate_shard",
      [](const std::string& path, uint64_t expected_records) {
        ShardLayout layout;
        {
          const GilRelease release;
          layout = validate_shard_file(path, expected_records);
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
      py::arg("path"), py::arg("expected_records"),
      "Validates a shard file's whole LMDB structure (CorruptShardError if unsound); returns a summary.");
  m.def("library_decode", &library_decode, py::arg("codec"), py::arg("blob"), py::arg("offsets"), py::arg("out"),
        py::arg("decoded_bytes"), py::arg("height") = 0, py::arg("width") = 0, py::arg("channels") = 0,
        "Decodes payloads laid end to end with the codec's library alone, one thread (a benchmark floor).");
  m.def(
      "begin_step", [] { exit_gate::enter_step(); },
      "A loader step (one next()) begins on this thread; once the interpreter is exiting, a thread other than "
      "the finalizing one parks here for good.");
  m.def(
      "end_step", [] { exit_gate::leave_step(); },
      "The step ends; once the interpreter is exiting, a thread other than the finalizing one parks here for good "
      "rather than return into Python.");
  m.attr("RECORD_MAGIC") = kRecordMagic;
  m.attr("RECORD_VERSION") = kRecordVersion;
  m.attr("DEFAULT_MAX_SAMPLE_BYTES") = kDefaultMaxSampleBytes;

  py::class_<ShardSet, std::shared_ptr<ShardSet>>(m, "ShardSet", "The shards of one dataset, mapped and validated.")
      .def(py::init([](const std::vector<std::string>& paths, const std::vector<uint64_t>& counts) {
             const GilRelease release;
             return std::make_shared<ShardSet>(paths, counts);
           }),
           py::arg("paths"), py::arg("counts"))
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

  py::class_<SlotLease>(m, "SlotLease", "Keeps a batch buffer out of the pool while arrays view it.");

  py::class_<SlotPool, std::shared_ptr<SlotPool>>(
      m, "SlotPool", "A reader's batch buffers; hand it to the next reader over the same fields to reuse them.")
      .def_property_readonly("slot_bytes", &SlotPool::slot_bytes)
      .def_property_readonly("free_slots", &SlotPool::free_count)
      .def_property_readonly("total_slots", &SlotPool::total_count)
      .def("keep_at_most", &SlotPool::keep_at_most, py::arg("count"),
           "Free extra free buffers now, and from now on keep no more than count free ones.");

  py::class_<PyBatchReader>(m, "BatchReader", "Worker threads decoding batches into pooled buffers.")
      .def(py::init<std::shared_ptr<const ShardSet>, const std::vector<FieldTuple>&, std::vector<py::dtype>,
                    std::vector<std::vector<py::ssize_t>>, std::vector<bool>, size_t, size_t, bool,
                    const std::vector<StepTuple>&, size_t, uint64_t, uint16_t, uint64_t,
                    std::vector<uint64_t>, std::shared_ptr<SlotPool>>(),
           py::arg("shards"), py::arg("fields"), py::arg("dtypes"), py::arg("shapes"), py::arg("decode"),
           py::arg("batch_capacity"), py::arg("num_threads"), py::arg("verify") = true,
           py::arg("transforms") = std::vector<StepTuple>{},
           py::arg("num_params") = 0, py::arg("max_sample_bytes") = kDefaultMaxSampleBytes,
           py::arg("record_version") = kRecordVersion, py::arg("schema_fingerprint") = 0,
           py::arg("shard_fingerprints") = std::vector<uint64_t>{}, py::arg("pool") = std::shared_ptr<SlotPool>())
      .def_property_readonly("slot_bytes", [](PyBatchReader& r) { return r.reader().slot_bytes(); })
      .def_property_readonly("num_threads", [](PyBatchReader& r) { return r.reader().num_threads(); })
      .def_property_readonly("pool", [](PyBatchReader& r) { return r.reader().pool(); })
      .def_property_readonly("free_slots", [](PyBatchReader& r) { return r.reader().pool()->free_count(); })
      .def_property_readonly("total_slots", [](PyBatchReader& r) { return r.reader().pool()->total_count(); })
      .def_property_readonly("pending", [](PyBatchReader& r) { return r.reader().pending(); })
      .def_property_readonly("ready", [](PyBatchReader& r) { return r.reader().ready(); })
      .def_property_readonly("closed", [](PyBatchReader& r) { return r.reader().closed(); })
      .def_property_readonly("field_offsets", &PyBatchReader::field_offsets)
      .def("add_slot", &PyBatchReader::add_slot, py::arg("buffer"), py::arg("reusable") = true)
      .def("add_split_slot", &PyBatchReader::add_split_slot, py::arg("buffers"), py::arg("reusable") = true)
      .def_property_readonly("field_bytes", [](PyBatchReader& r) {
        std::vector<size_t> out;
        for (size_t f = 0; f < r.field_count(); ++f) out.push_back(r.reader().field_bytes(f));
        return out;
      })
      .def("submit", &PyBatchReader::submit, py::arg("indices"), py::arg("params") = py::none())
      .def("next", &PyBatchReader::next)
      .def("next_count", &PyBatchReader::next_count)
      .def("close", &PyBatchReader::close)
      .def("stats", [](PyBatchReader& r) { return stats_dict(r.reader().stats()); })
      .def("reset_stats", [](PyBatchReader& r) { r.reader().reset_stats(); });

  // Test seams: not API (the leading underscore keeps them out of _native.pyi). tests/seams.py uses them.
  py::module_ testing = m.def_submodule("_testing", "Test seams of the native core; not part of fastload's API.");
  testing.def(
      "set_read_delay", [](PyBatchReader& r, uint32_t delay_us) { r.reader().set_read_delay_for_tests(delay_us); },
      py::arg("reader"), py::arg("delay_us"),
      "Make every worker of `reader` sleep `delay_us` before each record read (lifecycle tests).");
}
