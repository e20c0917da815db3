// Refused calls, counted and logged at a bounded rate: a flood of refusals (48,000 in 10 s
// from unauthenticated callers) must neither fill the disk with log lines nor hide who is
// refused. Each (caller, reason) pair logs at most one line per `interval`; the lines left out
// are counted and the next line of that pair says how many. All pairs together log at most
// `lines_per_interval` lines per interval. Counts stay for /metrics
// (meshrun_refused_calls_total{caller, reason}).
//
// `caller` is "unauthenticated" or an identity's "<role>/<name>"; at most kMaxPairs (caller,
// reason) pairs are counted by name, the rest as ("other", "other"), so the counts stay small
// whoever calls and whatever method path they send.
//
// Lifetime: Process() lives as long as the process.
// Thread-safety: every method is safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "rpc/security_policy.h"

namespace meshrun::services {

// "unauthenticated", or "<role>/<name>".
std::string CallerName(const std::optional<Identity>& caller);

class RefusalLog {
 public:
  static constexpr size_t kMaxPairs = 1024;

  RefusalLog(absl::Duration interval, int lines_per_interval)
      : interval_(interval), lines_per_interval_(lines_per_interval) {}

  // The process's log: one line per pair per 10 s, 20 lines per 10 s in all.
  static RefusalLog& Process();

  // Counts one refusal; logs `what` (a warning) when the rate allows. Returns whether it logged.
  bool Record(const std::string& caller, const std::string& reason, const std::string& what);

  // Records a call refused with `status` (not OK): the caller as CallerName, the reason as
  // "<code> <method's last part>" ("permission_denied ListJobs").
  bool RecordCall(const std::optional<Identity>& caller, const std::string& method,
                  const absl::Status& status, const std::string& what);

  // Refusals so far by (caller, reason).
  std::map<std::pair<std::string, std::string>, int64_t> Counts() const;

 private:
  struct Pair {
    int64_t count = 0;
    int64_t unlogged = 0;  // since its last line
    absl::Time last_line = absl::InfinitePast();
  };
  const absl::Duration interval_;
  const int lines_per_interval_;
  mutable absl::Mutex mu_;
  std::map<std::pair<std::string, std::string>, Pair> pairs_ ABSL_GUARDED_BY(mu_);
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int lines_in_window_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace meshrun::services
