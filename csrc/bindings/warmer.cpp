// Bindings of the Warmer (csrc/reader/warmer.h): the background thread that
// faults in a loader's first batch buffers and maps its shards' cached pages
// while the training script does other work. The Python side
// (fastload/loading/_warm_up.py) decides what to warm and stops it before a
// pass begins, and at interpreter exit.
//
// The buffer is a writable Python buffer (the numpy array BatchReader.
// reserve_slots returns); this wrapper keeps it alive until the thread is
// joined, and drops it with the GIL. In a child made by os.fork() the thread
// does not exist: stop() does nothing and the destructor lets go of it
// without a join.
#include <unistd.h>

#include <optional>

#include "bindings/bindings.h"
#include "reader/warmer.h"

namespace fastload::bindings {

namespace {

class PyWarmer {
 public:
  PyWarmer(const std::optional<py::buffer>& buffer, std::shared_ptr<const ShardSet> shards,
           uint64_t max_mapping_bytes) {
    std::vector<Warmer::Buffer> buffers;
    if (buffer) {
      const py::buffer_info info = buffer->request(true);  // writable: it becomes batch memory
      if (info.ndim != 1 || info.itemsize != 1 || info.strides[0] != 1) {
        throw py::value_error("Warmer: the buffer must be contiguous bytes");
      }
      buffers.push_back({static_cast<uint8_t*>(info.ptr), static_cast<size_t>(info.size)});
      buffer_ = *buffer;
    }
    warmer_ = std::make_unique<Warmer>(std::move(buffers), std::move(shards), max_mapping_bytes);
  }

  ~PyWarmer() {
    if (forked()) {
      warmer_->abandon();
      static_cast<void>(warmer_.release());
      static_cast<void>(buffer_.release());  // the parent's thread may be writing it: never freed here
      return;
    }
    {
      const GilRelease release;
      warmer_.reset();  // stops and joins the thread
    }
  }

  PyWarmer(const PyWarmer&) = delete;
  PyWarmer& operator=(const PyWarmer&) = delete;

  void stop(bool wait) {
    if (forked()) return;
    if (!wait) {
      warmer_->request_stop();
      return;
    }
    const GilRelease release;
    warmer_->stop();
  }

  py::dict stats() const {
    const Warmer::Stats s = warmer_->stats();
    py::dict d;
    d["prefaulted_bytes"] = s.prefaulted_bytes;
    d["claimed_bytes"] = s.claimed_bytes;
    d["mapped_bytes"] = s.mapped_bytes;
    d["seconds"] = s.seconds;
    d["done"] = s.done;
    d["supported"] = s.supported;
    return d;
  }

 private:
  bool forked() const noexcept { return ::getpid() != owner_pid_; }

  const pid_t owner_pid_ = ::getpid();
  py::object buffer_;                // the buffer's memory outlives the thread
  std::unique_ptr<Warmer> warmer_;  // destroyed (joined) first, by the destructor
};

}  // namespace

void register_warmer(py::module_& m) {
  py::class_<PyWarmer>(m, "Warmer",
                       "A background thread faulting in batch buffers and mapping the shards' cached pages; "
                       "stop() joins it.")
      .def(py::init<const std::optional<py::buffer>&, std::shared_ptr<const ShardSet>, uint64_t>(),
           py::arg("buffer"), py::arg("shards"), py::arg("max_mapping_bytes"))
      .def("stop", &PyWarmer::stop, py::arg("wait") = true,
           "Stop the thread (at most one 2 MiB step later) and join it; with wait=False only ask it to stop.")
      .def("stats", &PyWarmer::stats, "Return what it did so far: prefaulted_bytes, claimed_bytes, mapped_bytes, seconds, done, supported.");
}

}  // namespace fastload::bindings
