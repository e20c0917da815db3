// Liveness by progress: finds running jobs whose hosts stopped advancing steps, and names the
// host that stopped first and where the others wait (docs/liveness.md).
//
// Workers report, with each heartbeat, the job they run, its last completed step and their
// phase ("the gradient all-reduce" while a host replica waits for its peers). A job is hung
// when no host of it completed a step for `hang_timeout`. The culprit is, in order: the host
// with the lowest last completed step; among those, one not waiting in a collective; then the
// one whose reports stopped longest ago (a SIGSTOPped or partitioned host reports nothing).
//
//   "local-worker-1 made no progress since step 812 (no report for 9.5s); local-worker-0
//    waits in the gradient all-reduce after step 812"
//
// A plain logic class: time comes from the injected clock, so tests move it by hand.
// Lifetime: Create() returns an owned monitor; the clock must outlive it.
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/natural_order.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/protocol.h"

namespace meshrun::coordinator {

class ProgressMonitor {
 public:
  struct Config {
    absl::Duration hang_timeout = absl::ZeroDuration();  // zero: hang detection off
    Clock* clock = &RealClock();
  };
  struct Hang {
    std::string job_id;
    std::string host;   // the host that stopped first
    std::string error;  // names it and where every other host waits
  };

  // Errors: INVALID_ARGUMENT when hang_timeout is negative or the clock is null.
  static absl::StatusOr<std::unique_ptr<ProgressMonitor>> Create(Config config);

  // Watches `job_id` running on `hosts`, from now (a host that never reports counts as
  // having stopped at step 0). Replaces an earlier watch of the same job.
  void StartJob(const std::string& job_id, const std::vector<std::string>& hosts);
  void EndJob(const std::string& job_id);
  // One host's progress. Ignored for jobs not watched or hosts not in the job.
  void Report(const std::string& host, const std::string& job_id, int64_t last_completed_step,
              const std::string& phase);

  // Watched jobs in which no host completed a step for hang_timeout; each is returned once
  // and no longer watched. Always empty when detection is off.
  std::vector<Hang> Overdue();

  absl::Duration hang_timeout() const { return config_.hang_timeout; }

 private:
  struct HostProgress {
    int64_t step = 0;
    std::string phase;
    absl::Time advanced;     // when `step` last grew (job start before any)
    absl::Time reported;     // last report (job start before any)
    bool ever_reported = false;
  };
  // A job's hosts in natural order (w-2 before w-10): ties are broken and waits listed so.
  using Hosts = std::map<std::string, HostProgress, NaturalOrder>;
  explicit ProgressMonitor(Config config) : config_(config) {}
  Hang Describe(const std::string& job_id, const Hosts& hosts, absl::Time now) const;

  const Config config_;
  absl::Mutex mu_;
  std::map<std::string, Hosts> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun::coordinator
