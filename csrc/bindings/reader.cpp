// The batch worker pool for Python: BatchReader (one consumer; next() waits in
// slices so Ctrl-C interrupts it; fork and interpreter exit as module.cpp says),
// SlotPool, SlotLease, and the test seams.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings/bindings.h"
#include "checked_math.h"
#include "errors.h"
#include "platform/platform.h"
#include "reader/batch_reader.h"
#include "reader/permutation.h"
#include "reader/shard_reader.h"

namespace fastload::bindings {
namespace {

constexpr int kSignalPollMs = 50;
constexpr size_t kHugePage = size_t{2} << 20;  // the x86-64 and arm64 huge page (4 KiB base pages)

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

// The epoch order (seed, epoch, n) planned positions are mapped through, or none: the values are sample indices.
std::shared_ptr<const Permutation> epoch_order(const std::optional<std::tuple<uint64_t, uint64_t, uint64_t>>& p) {
  if (!p) return nullptr;
  const auto [seed, epoch, n] = *p;
  return std::make_shared<const Permutation>(seed, epoch, n);
}

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
                std::shared_ptr<SlotPool> pool, size_t max_running)
      : dtypes_(std::move(dtypes)), shapes_(std::move(shapes)), num_params_(num_params) {
    if (dtypes_.size() != fields.size() || shapes_.size() != fields.size() || decode.size() != fields.size()) {
      throw py::value_error("fields, dtypes, shapes and decode differ in length");
    }
    if (batch_capacity == 0) throw py::value_error("batch_capacity must be positive");
    if (num_threads == 0) throw py::value_error("num_threads must be positive");
    auto specs = to_specs(fields);
    ReaderOptions options;
    options.batch_capacity = batch_capacity;
    options.num_threads = num_threads;
    options.verify_checksums = verify;
    options.decode_field = std::move(decode);
    options.transforms = to_pipeline(steps, specs, num_params);
    options.max_sample_bytes = max_sample_bytes;
    options.record_version = record_version;
    options.schema_fingerprint = schema_fingerprint;
    options.shard_fingerprints = std::move(shard_fingerprints);
    options.pool = std::move(pool);
    options.max_running = max_running;
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
  bool submit(const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& indices,
              const std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>& params) {
    std::vector<uint64_t> copy(indices.data(), indices.data() + indices.size());
    std::vector<int64_t> values = param_values("submit", indices.size(), params);
    BatchReader& r = reader();
    const ConsumerGuard guard(busy_, "submit");
    const GilRelease release;
    return r.submit(std::move(copy), std::move(values));
  }

  // Batches planned ahead (see BatchReader::plan): indices one batch after
  // another, each batch's size, and the parameters as for submit(). With
  // permutation = (seed, epoch, n), the values are positions of that epoch
  // order (docs/ORDER.md), mapped by the workers.
  void plan(const py::array_t<uint64_t, py::array::c_style | py::array::forcecast>& indices,
            const std::vector<size_t>& sizes,
            const std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>& params,
            const std::optional<std::tuple<uint64_t, uint64_t, uint64_t>>& permutation) {
    std::vector<uint64_t> copy(indices.data(), indices.data() + indices.size());
    std::shared_ptr<const Permutation> order = epoch_order(permutation);
    std::vector<int64_t> values = param_values("plan", indices.size(), params);
    BatchReader& r = reader();
    const ConsumerGuard guard(busy_, "plan");
    const GilRelease release;
    r.plan(copy, sizes, values, std::move(order));
  }

  // Batches first to stop - 1 of one rank's epoch plan (RankPlan: _plan.py's EpochPlan as six numbers),
  // their positions worked out by the reader as its window reaches them; with permutation = (seed, epoch, n)
  // mapped through that epoch order, else read as sample indices.
  void plan_positions(const std::tuple<uint64_t, uint64_t, uint64_t, uint64_t, uint64_t, uint64_t>& rank_plan,
                      size_t first, size_t stop,
                      const std::optional<std::tuple<uint64_t, uint64_t, uint64_t>>& permutation) {
    const auto [start, remaining, rank, world_size, samples, batch_size] = rank_plan;
    const RankPlan plan(start, remaining, rank, world_size, samples, batch_size);
    std::shared_ptr<const Permutation> order = epoch_order(permutation);
    BatchReader& r = reader();
    const ConsumerGuard guard(busy_, "plan_positions");
    const GilRelease release;
    r.plan_positions(plan, first, stop, std::move(order));
  }

  CompletedBatch wait() {
    BatchReader& r = reader();
    const ConsumerGuard guard(busy_, "next");
    // Planned batches wait for free slots: plain buffers are added here, as submitting callers add them
    // before submit(). In a steady loop none is wanted (the slots come back), and nothing is allocated.
    const size_t wanted = r.slots_wanted();
    if (wanted > 0) {
      FreshSlots fresh = add_slots(r, wanted);
      if (prefault_) unfaulted_.push_back(std::move(fresh));
    }
    if (!unfaulted_.empty()) prefault_while_waiting(r);  // a few locks, then only while the batch is not ready
    // A batch already complete is taken with the GIL held: letting the GIL go and taking it back would cost
    // the consumer more than the take (issue 26: its time per batch). Workers never wait for the GIL while
    // they hold the reader's lock, so holding it here for the take cannot deadlock.
    std::optional<CompletedBatch> batch = r.wait_next(std::chrono::milliseconds(0));
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

  // Slots added and not yet faulted in: [data, data + size) is still to do, and `owner` keeps it alive.
  struct FreshSlots {
    uint8_t* data = nullptr;
    size_t size = 0;
    std::shared_ptr<GilObject> owner;
  };

  // While the next batch is not ready, this thread (which would only sleep) faults in the pages of fresh slots,
  // 2 MiB at a time, in the order opposite to the workers': the pool hands out the slots a buffer holds from its
  // end (last in, first out), so this goes from its start, through the slots needed last. In a fresh process
  // the first touch of new memory is a large part of a first epoch's work (issue 26; on a virtual machine up
  // to milliseconds per MB). It stops when the batch is ready, or after kSignalPollMs (so that Ctrl-C is seen
  // as promptly as in the wait), and goes on at the next wait; pages the workers reached first cost nothing.
  void prefault_while_waiting(BatchReader& r) {
    r.submit_planned();  // the workers start on the new slots meanwhile (a short lock: no GIL needed by them)
    if (r.next_ready()) return;
    bool supported = true;
    {
      const GilRelease release;
      const auto start = std::chrono::steady_clock::now();
      const auto until = start + std::chrono::milliseconds(kSignalPollMs);
      size_t i = unfaulted_.size();  // the newest buffer first: the workers are least likely to be there yet
      while (i > 0 && supported && !r.next_ready() && std::chrono::steady_clock::now() < until) {
        FreshSlots& region = unfaulted_[i - 1];
        if (region.size == 0) {
          --i;
          continue;
        }
        const size_t step = std::min(region.size, kHugePage);  // a buffer of 2 MiB or more starts 2 MiB-aligned
        supported = prefault_for_writing(region.data, step);
        region.data += step;
        region.size -= step;
        prefaulted_bytes_ += step;
      }
      prefault_ns_ += static_cast<uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count());
    }
    if (!supported) {  // this system cannot: no more tries (their owners go with the GIL, as below)
      prefaulted_bytes_ = 0;
      unfaulted_.clear();
      return;
    }
    // Done regions let go of their memory here, with the GIL (their owner is a Python object).
    unfaulted_.erase(std::remove_if(unfaulted_.begin(), unfaulted_.end(), [](const FreshSlots& f) { return f.size == 0; }),
                     unfaulted_.end());
  }

  // `count` plain slots in one numpy buffer, kept alive until the last of them leaves the pool. With 2 MiB
  // or more of them, the buffer starts them on a 2 MiB boundary and asks for huge pages: a fresh process then
  // faults its batch buffers in (the workers' first writes) 2 MiB at a time instead of 4 KiB at a time.
  // Returns them as fresh slots (for prefault_while_waiting).
  static FreshSlots add_slots(BatchReader& r, size_t count) {
    const size_t bytes = r.slot_bytes();
    const size_t total = mul_or_raise<FastloadError>(bytes, count, "batch buffers");
    const size_t pad = total >= kHugePage ? kHugePage : 0;  // virtual only: the pad is never touched
    py::array_t<uint8_t> buffer(static_cast<py::ssize_t>(add_or_raise<FastloadError>(total, pad, "batch buffers")));
    uint8_t* data = buffer.mutable_data();
    if (pad > 0) {
      data += (kHugePage - reinterpret_cast<uintptr_t>(data) % kHugePage) % kHugePage;
      advise_huge_pages(data, total);
    }
    const auto owner = std::make_shared<GilObject>(std::move(buffer));
    for (size_t i = 0; i < count; ++i) r.pool()->add(data + i * bytes, bytes, owner);
    return FreshSlots{data, total, owner};
  }

  // Adds fresh slots until the pool holds `count` (in one buffer, as a wait adds them) and returns their memory
  // as one uint8 array viewing that buffer, for a Warmer to fault in before the first pass; None when the pool
  // holds that many already.
  py::object reserve_slots(size_t count) {
    BatchReader& r = reader();
    const ConsumerGuard guard(busy_, "reserve_slots");
    const size_t have = r.pool()->total_count();
    if (have >= count) return py::none();
    const FreshSlots fresh = add_slots(r, count - have);
    return py::array_t<uint8_t>({static_cast<py::ssize_t>(fresh.size)}, {py::ssize_t{1}}, fresh.data, fresh.owner->obj);
  }

  // Memory of slots already in the pool (reserve_slots') that a warm-up did not fault in: with
  // prefault_while_waiting on, this thread faults it in while it waits, as the slots a wait adds.
  void prefault_later(const py::array_t<uint8_t, py::array::c_style>& region) {
    if (!prefault_ || region.size() == 0) return;
    uint8_t* data = const_cast<uint8_t*>(region.data());  // NOLINT: the pool's writable batch memory
    unfaulted_.push_back(FreshSlots{data, static_cast<size_t>(region.size()), std::make_shared<GilObject>(region)});
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

  // Bytes of fresh batch buffers this reader's consumer faulted in while it waited for batches, and the
  // time that took (time waiting for data too: stats() adds it to wait_s).
  size_t prefaulted_bytes() const { return prefaulted_bytes_; }
  double prefault_s() const { return static_cast<double>(prefault_ns_) * 1e-9; }
  void reset_prefault_stats() {
    prefaulted_bytes_ = 0;
    prefault_ns_ = 0;
  }
  // Whether the consumer faults fresh batch buffers in while it waits (policy: the Python side turns it
  // on where a core would otherwise be idle). Off by default.
  bool prefault() const { return prefault_; }
  void set_prefault(bool on) { prefault_ = on; }

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
  // The transform parameters of `samples` samples, [samples, num_params] int64 (none when absent).
  std::vector<int64_t> param_values(
      const char* what, py::ssize_t samples,
      const std::optional<py::array_t<int64_t, py::array::c_style | py::array::forcecast>>& params) const {
    if (!params) return {};
    if (params->ndim() != 2 || static_cast<size_t>(params->shape(1)) != num_params_ || params->shape(0) != samples) {
      throw py::value_error(std::string(what) + ": params must have shape [" + std::to_string(samples) + ", " +
                            std::to_string(num_params_) + "]");
    }
    return std::vector<int64_t>(params->data(), params->data() + params->size());
  }

  // In a forked child: the worker threads are the parent's and may have held
  // the reader's mutexes at the fork, so neither lock nor join; leak instead.
  void abandon() noexcept { static_cast<void>(reader_.release()); }

  std::vector<py::dtype> dtypes_;
  std::vector<std::vector<py::ssize_t>> shapes_;
  size_t num_params_ = 0;
  std::unique_ptr<BatchReader> reader_;
  std::vector<FreshSlots> unfaulted_;  // fresh slots whose pages this thread faults in while it waits
  size_t prefaulted_bytes_ = 0;        // how much of them it did (0 where the system cannot)
  uint64_t prefault_ns_ = 0;           // and for how long
  bool prefault_ = false;              // whether it does (set_prefault)
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
  d["peak_running"] = s.peak_running;
  d["disk_chunks"] = s.disk_chunks;
  return d;
}

}  // namespace

void register_reader(py::module_& m) {
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
                    std::vector<uint64_t>, std::shared_ptr<SlotPool>, size_t>(),
           py::arg("shards"), py::arg("fields"), py::arg("dtypes"), py::arg("shapes"), py::arg("decode"),
           py::arg("batch_capacity"), py::arg("num_threads"), py::arg("verify") = true,
           py::arg("transforms") = std::vector<StepTuple>{},
           py::arg("num_params") = 0, py::arg("max_sample_bytes") = kDefaultMaxSampleBytes,
           py::arg("record_version") = kRecordVersion, py::arg("schema_fingerprint") = 0,
           py::arg("shard_fingerprints") = std::vector<uint64_t>{}, py::arg("pool") = std::shared_ptr<SlotPool>(),
           py::arg("max_running") = 0)
      .def_property_readonly("slot_bytes", [](PyBatchReader& r) { return r.reader().slot_bytes(); })
      .def_property_readonly("num_threads", [](PyBatchReader& r) { return r.reader().num_threads(); })
      .def_property_readonly("max_running", [](PyBatchReader& r) { return r.reader().max_running(); })
      .def_property_readonly("pool", [](PyBatchReader& r) { return r.reader().pool(); })
      .def_property_readonly("free_slots", [](PyBatchReader& r) { return r.reader().pool()->free_count(); })
      .def_property_readonly("total_slots", [](PyBatchReader& r) { return r.reader().pool()->total_count(); })
      .def("reserve_slots", &PyBatchReader::reserve_slots, py::arg("count"),
           "Add fresh batch buffers until the pool holds `count`; return their memory (uint8 array) or None.")
      .def("prefault_later", &PyBatchReader::prefault_later, py::arg("region"),
           "With prefault_while_waiting on: fault `region` (pooled slots' memory) in while waiting.")
      .def_property("prefault_while_waiting", &PyBatchReader::prefault, &PyBatchReader::set_prefault)
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
      .def("plan_positions", &PyBatchReader::plan_positions, py::arg("rank_plan"), py::arg("first"),
           py::arg("stop"), py::arg("permutation") = py::none(),
           "Plans batches first..stop-1 of a rank's epoch plan (start, remaining, rank, world_size, samples, "
           "batch_size), positions worked out by the reader; mapped through the epoch permutation (seed, epoch, n) "
           "when given.")
      .def("plan", &PyBatchReader::plan, py::arg("indices"), py::arg("sizes"), py::arg("params") = py::none(),
           py::arg("permutation") = py::none())
      .def("set_window", [](PyBatchReader& r, size_t window, size_t first_window) {
        r.reader().set_window(window, first_window);
      }, py::arg("window"), py::arg("first_window"))
      .def_property_readonly("planned", [](PyBatchReader& r) { return r.reader().planned(); })
      .def("next", &PyBatchReader::next)
      .def("next_count", &PyBatchReader::next_count)
      .def("close", &PyBatchReader::close)
      .def("stats",
           [](PyBatchReader& r) {
             py::dict d = stats_dict(r.reader().stats());
             d["prefaulted_bytes"] = r.prefaulted_bytes();
             d["prefault_s"] = r.prefault_s();  // the consumer waited for data meanwhile: part of wait_s
             d["wait_s"] = d["wait_s"].cast<double>() + r.prefault_s();
             return d;
           })
      .def("reset_stats", [](PyBatchReader& r) {
        r.reader().reset_stats();
        r.reset_prefault_stats();
      });

  // Test seams: not API (the leading underscore keeps them out of _native.pyi). tests/seams.py uses them.
  py::module_ testing = m.def_submodule("_testing", "Test seams of the native core; not part of fastload's API.");
  testing.def(
      "set_read_delay", [](PyBatchReader& r, uint32_t delay_us) { r.reader().set_read_delay_for_tests(delay_us); },
      py::arg("reader"), py::arg("delay_us"),
      "Make every worker of `reader` sleep `delay_us` before each record read (lifecycle tests).");
  testing.def(
      "set_disk_reads", [](PyBatchReader& r, bool on) { r.reader().set_disk_reads_for_tests(on); },
      py::arg("reader"), py::arg("on"),
      "Make `reader` take every slow chunk for one that waited for the disk (its turns tests).");
}

}  // namespace fastload::bindings
