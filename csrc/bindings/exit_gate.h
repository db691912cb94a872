// The exit gate: no thread takes the GIL back through fastload once the
// interpreter has begun to exit, except the thread that finalizes it.
//
// Why: CPython <= 3.13 ends a thread that asks for the GIL after finalization
// has begun (or while finalization begins under it) with pthread_exit. Its
// forced unwind runs through whatever C++ frames lie above: through a
// destructor (every GIL-release scope ends in one), a noexcept function or a
// catch (...) that does not rethrow, it calls std::terminate and the process
// aborts ("terminate called without an active exception", status 134). The
// check `Py_IsFinalizing()` before `PyEval_RestoreThread` cannot prevent it:
// finalization may begin between the check and the call, or while the thread
// waits inside it.
//
// How: fastload's atexit hook (begin_exit) runs on the finalizing thread
// before CPython marks the runtime as finalizing. It closes the gate, lets the
// threads already past the gate take the GIL and return (it releases the GIL
// and waits for them), and gives threads inside a loader's next() a moment to
// reach a point where they park, and threads between two loader steps (which
// may be dropping a batch: torch releases the GIL inside a tensor's
// deallocation) a shorter one to enter the next step, where they park. From
// then on a thread other than the
// finalizing one that would take the GIL through fastload parks for good
// instead: it sleeps, holding nothing, until the process exits (as CPython
// 3.14 does with such threads itself). A thread that needs the GIL only to
// drop a Python object (a batch buffer freed on a worker thread, say) leaks
// the object instead and goes on. Once the interpreter is gone (Py_AtExit)
// no thread touches Python at all.
//
// A thread is counted "past the gate" from its check to the moment it holds
// the GIL, with one atomic word, so the check and the count cannot be split by
// the hook. The state is per process (the interpreter is), lock-free (a fork
// child inherits no held lock), and reset (open) in a fork child.
//
// A thread other than the finalizing one that would need fastload after the
// hook has run parks: an atexit callback registered before fastload was
// imported (so run after its hook) must not wait for such a thread.
#pragma once

#include <Python.h>

namespace fastload::exit_gate {

// The hooks the module installs at import: begin_exit with atexit (it runs on
// the finalizing thread, GIL held, before the runtime is marked finalizing),
// after_fork_in_child with os.register_at_fork, interpreter_gone with Py_AtExit.
void begin_exit() noexcept;
void after_fork_in_child() noexcept;
void interpreter_gone() noexcept;

// Never returns: this thread sleeps until the process exits. Call it without the GIL.
[[noreturn]] void park() noexcept;

// Takes the GIL back after PyEval_SaveThread(state), or parks for good when
// the interpreter is exiting and this is not the thread that finalizes it.
void restore_or_park(PyThreadState* state) noexcept;

// Releases the GIL for a scope; at its end takes it back or parks (never
// unwinds into a frame that cannot pass a forced unwind).
class GilRelease {
 public:
  GilRelease() noexcept : state_(PyEval_SaveThread()) {}
  ~GilRelease() { restore_or_park(state_); }
  GilRelease(const GilRelease&) = delete;
  GilRelease& operator=(const GilRelease&) = delete;

 private:
  PyThreadState* state_;
};

// Holds the GIL for a scope, from any thread (one that holds it already, a
// Python thread that released it, a C++ worker), when Python may still be
// touched: held() is false once the interpreter is exiting (for a thread
// other than the finalizing one), and the caller must then leave Python
// objects alone (leak them).
class GilForThisThread {
 public:
  GilForThisThread() noexcept;
  ~GilForThisThread();
  GilForThisThread(const GilForThisThread&) = delete;
  GilForThisThread& operator=(const GilForThisThread&) = delete;
  bool held() const noexcept { return held_; }

 private:
  bool held_ = false;
  PyGILState_STATE state_{};
};

// A loader step (one next()) on this thread: enter_step() parks when the
// interpreter is exiting, leave_step() parks rather than return into Python
// then (the hook waits a moment for steps in flight to get here). With the GIL held.
void enter_step() noexcept;
void leave_step() noexcept;

}  // namespace fastload::exit_gate
