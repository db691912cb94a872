// CHECK for the C++ test executables (no test framework: they build with any
// C++17 compiler, mingw-w64 included, and run under Wine). CHECK(cond) counts
// a check and, when cond is false, prints the file, line and condition and
// counts a failure; report() prints the tally and returns the exit status.
// Each test executable is its own program, single-threaded: the tally lives here.
#pragma once

#include <cstdio>
#include <exception>

namespace fastload::test {

inline int checks = 0;
inline int failures = 0;

inline void check(bool ok, const char* file, int line, const char* what) {
  ++checks;
  if (!ok) {
    std::printf("FAIL %s:%d: %s\n", file, line, what);
    ++failures;
  }
}

// An exception that escaped the tests: a failure, not a crash.
inline void unexpected(const std::exception& e) {
  std::printf("FAIL: unexpected exception: %s\n", e.what());
  ++failures;
}

// Prints "<name>: N checks, M failed"; returns main's exit status.
inline int report(const char* name) {
  std::printf("%s: %d checks, %d failed\n", name, checks, failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace fastload::test

#define CHECK(cond) ::fastload::test::check(static_cast<bool>(cond), __FILE__, __LINE__, #cond)
