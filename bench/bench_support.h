// Small pieces every benchmark needs: a failure line, a monotonic clock, the median and the
// spread of per-round figures.
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

// CPU time of the calling thread in seconds.
inline double ThreadCpuSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

// The median; the mean of the middle two for an even count.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

// The quantile q (0..1) of `v`, linear between the closest ranks; 0 for an empty `v`.
inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}

// "median M (IQR a..b, min c, max d, n rounds)" with `digits` decimals, for the line above a
// ratio: the spread says whether the median resolves a claim (a 1% claim needs an IQR well
// inside 1%).
inline std::string Spread(const std::vector<double>& v, int digits = 3) {
  if (v.empty()) return "no rounds";
  char out[200];
  std::snprintf(out, sizeof(out), "median %.*f (IQR %.*f..%.*f, min %.*f, max %.*f, %zu rounds)",
                digits, Median(v), digits, Quantile(v, 0.25), digits, Quantile(v, 0.75), digits,
                *std::min_element(v.begin(), v.end()), digits,
                *std::max_element(v.begin(), v.end()), v.size());
  return out;
}

}  // namespace meshrun::bench
