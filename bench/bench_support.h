// Small pieces every benchmark needs: a failure line, a monotonic clock and the median.
// Header-only; thread-safe.
#pragma once

#include <errno.h>  // program_invocation_short_name (glibc)
#include <time.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace meshrun::bench {

// Prints "<benchmark>: <what>: <status>" and returns the exit code 1.
inline int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "%s: %s: %s\n", program_invocation_short_name, what.c_str(),
               status.ToString().c_str());
  return 1;
}

// Monotonic wall time in seconds.
inline double Now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// CPU time of the whole process (every thread) in seconds.
inline double ProcessCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// The median; the mean of the middle two for an even count.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace meshrun::bench
