// The extension module fastload._native: its one entry point. The binding
// files (bindings.h lists them by area) are the only code that knows Python.
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
#include "bindings/bindings.h"
#include "bindings/exit_gate.h"

namespace py = pybind11;
using namespace fastload;

PYBIND11_MODULE(_native, m) {
  m.doc() = "fastload's native core: LMDB shard reading, record decoding and the batch worker pool.";
  bindings::register_errors(m);
  // Interpreter exit and fork: exit_gate.h. atexit runs its callbacks last registered first: multiprocessing's,
  // which terminates daemonic children (torch DataLoader workers a pass is reading from), is registered first so
  // that it runs after the gate has parked the threads reading from them.
  py::module_::import("multiprocessing.util");
  py::module_::import("atexit").attr("register")(py::cpp_function([] { exit_gate::begin_exit(); }));
  py::module_::import("os").attr("register_at_fork")(
      py::arg("after_in_child") = py::cpp_function([] { exit_gate::after_fork_in_child(); }));
  Py_AtExit(&exit_gate::interpreter_gone);

  m.def(
      "begin_step", [] { exit_gate::enter_step(); },
      "A loader step (one next()) begins on this thread; once the interpreter is exiting, a thread other than "
      "the finalizing one parks here for good.");
  m.def(
      "end_step", [] { exit_gate::leave_step(); },
      "The step ends; once the interpreter is exiting, a thread other than the finalizing one parks here for good "
      "rather than return into Python.");
  bindings::register_order(m);
  bindings::register_codecs(m);
  bindings::register_shards(m);
  bindings::register_reader(m);
  bindings::register_warmer(m);
}
