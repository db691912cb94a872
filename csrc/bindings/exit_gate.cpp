#include "bindings/exit_gate.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace fastload::exit_gate {
namespace {

// How long begin_exit waits for threads inside a loader step to reach a point
// where they park (a native wait parks within one poll, 50 ms; the torch
// backend finishes the batch it is reading).
constexpr auto kStepGrace = std::chrono::seconds(5);

// How long begin_exit waits for threads that left a loader step to enter the
// next one (where they park). A thread iterating a loader comes back within
// microseconds; until it does, it may drop the batch it was handed, and torch
// releases the GIL inside a tensor's deallocation (THPVariable_clear), so a
// drop under way as finalization begins ends in pthread_exit unwinding through
// torch's C++ frames (std::terminate). A thread that does not come back within
// this time (it stopped iterating) is not waited for further.
constexpr auto kBetweenStepsGrace = std::chrono::milliseconds(250);

constexpr uint64_t kClosed = uint64_t{1} << 63;
constexpr uint64_t kCountMask = kClosed - 1;

// The interpreter's exit is a per-process event, so this state is per process
// (not per reader): constant-initialized, lock-free, trivially destructible
// (a worker may read it while the process runs its static destructors).
std::atomic<uint64_t> g_word{0};              // kClosed | threads between the gate and the GIL
std::atomic<unsigned long> g_finalizer{0};    // the thread that ran begin_exit
std::atomic<bool> g_gone{false};              // Py_FinalizeEx has finished
std::atomic<int64_t> g_steps{0};              // threads inside a loader step, not parked
std::atomic<int64_t> g_between{0};            // threads between two loader steps: not parked, not ended
thread_local int t_step_depth = 0;            // this thread's nesting of loader steps

// Whether this thread is counted in g_between; uncounted when the thread ends.
struct BetweenSteps {
  bool counted = false;
  void mark() noexcept {
    if (!counted) {
      counted = true;
      g_between.fetch_add(1);
    }
  }
  void clear() noexcept {
    if (counted) {
      counted = false;
      g_between.fetch_sub(1);
    }
  }
  ~BetweenSteps() { clear(); }
};
thread_local BetweenSteps t_between;

enum class Pass { kCounted, kFinalizer, kRefused };

bool is_finalizer() noexcept { return PyThread_get_thread_ident() == g_finalizer.load(); }

bool closed() noexcept { return (g_word.load() & kClosed) != 0; }

// The check and the count are one atomic step: begin_exit either sees this
// thread counted (and waits until it holds the GIL) or this thread sees the
// gate closed.
Pass enter() noexcept {
  const uint64_t before = g_word.fetch_add(1);
  if ((before & kClosed) == 0) return Pass::kCounted;
  g_word.fetch_sub(1);
  return is_finalizer() ? Pass::kFinalizer : Pass::kRefused;
}

void leave(Pass pass) noexcept {
  if (pass == Pass::kCounted) g_word.fetch_sub(1);
}

void leave_step_count() noexcept {
  if (t_step_depth > 0) {
    t_step_depth = 0;
    g_steps.fetch_sub(1);
  }
}

}  // namespace

void begin_exit() noexcept {
  g_finalizer.store(PyThread_get_thread_ident());
  t_between.clear();  // the finalizing thread never parks: not waited for
  g_word.fetch_or(kClosed);
  // Threads counted before the gate closed are waiting for the GIL: let them
  // have it (finalization must not begin while one waits). Threads inside a
  // loader step get a moment to reach the point where they park, so that they
  // do not go on into code that drops the GIL as finalization begins; threads
  // between two steps a shorter one to enter the next (and park there).
  PyThreadState* state = PyEval_SaveThread();
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    const auto now = std::chrono::steady_clock::now();
    const bool counted = (g_word.load() & kCountMask) != 0;
    const bool stepping = g_steps.load() > 0 && now < start + kStepGrace;
    const bool between = g_between.load() > 0 && now < start + kBetweenStepsGrace;
    if (!counted && !stepping && !between) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  PyEval_RestoreThread(state);
}

void after_fork_in_child() noexcept {
  // A new process whose interpreter is not exiting (even when a thread forked
  // while the parent's gate was closing), with one thread, the forking one: it
  // holds the GIL (not counted) and may be inside a step.
  g_word.store(0);
  g_steps.store(t_step_depth > 0 ? 1 : 0);
  g_between.store(t_between.counted ? 1 : 0);
}

void interpreter_gone() noexcept {
  g_word.fetch_or(kClosed);
  g_gone.store(true);
}

void park() noexcept {
  leave_step_count();
  t_between.clear();
  for (;;) std::this_thread::sleep_for(std::chrono::hours(24));
}

void restore_or_park(PyThreadState* state) noexcept {
  const Pass pass = enter();
  if (pass == Pass::kRefused) park();
  PyEval_RestoreThread(state);
  leave(pass);
}

GilForThisThread::GilForThisThread() noexcept {
  if (g_gone.load()) return;
  const Pass pass = enter();
  if (pass == Pass::kRefused) return;
  state_ = PyGILState_Ensure();
  leave(pass);
  held_ = true;
}

GilForThisThread::~GilForThisThread() {
  if (held_) PyGILState_Release(state_);
}

void enter_step() noexcept {
  // With the GIL held, as begin_exit closes the gate: the check and the count
  // are not split by it.
  t_between.clear();
  if (closed() && !is_finalizer()) {
    PyEval_SaveThread();
    park();
  }
  if (t_step_depth++ == 0) g_steps.fetch_add(1);
}

void leave_step() noexcept {
  if (t_step_depth > 0 && --t_step_depth == 0) {
    g_steps.fetch_sub(1);
    t_between.mark();
  }
  if (closed() && !is_finalizer()) {
    PyEval_SaveThread();
    park();
  }
}

}  // namespace fastload::exit_gate
