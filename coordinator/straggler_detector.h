// Flags hosts that are persistently slower than their peers (docs/liveness.md).
//
// Per logging step, every host of a job reports its step time. A host is slow at that step
// when its time exceeds median + mad_factor * MAD of its peers' times (the other hosts; MAD =
// median absolute deviation), and by at least `min_margin` of that median (two hosts have
// MAD 0, so noise alone would flag one). A host slow at `consecutive` logging steps in a row
// is flagged; one step at normal speed clears the flag.
//
// Plain logic: no clock, no I/O. Lifetime: owned by the caller.
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/natural_order.h"

namespace meshrun::coordinator {

class StragglerDetector {
 public:
  struct Config {
    double mad_factor = 3.0;
    double min_margin = 0.5;  // fraction of the peers' median
    int consecutive = 3;      // K logging steps in a row
  };
  // Errors: INVALID_ARGUMENT (a negative factor or margin, consecutive < 1; named).
  static absl::StatusOr<std::unique_ptr<StragglerDetector>> Create(Config config);

  // Watches a job on `hosts` (replacing an earlier watch of it).
  void StartJob(const std::string& job_id, const std::vector<std::string>& hosts);
  void EndJob(const std::string& job_id);
  // One host's time for one logging step. A step is judged once every host reported it.
  // Returns true when the job's flagged hosts changed. Ignored for unknown jobs or hosts.
  bool Observe(const std::string& job_id, const std::string& host, int64_t step,
               double step_time_seconds);
  // The hosts flagged now, in natural order (w-2 before w-10); empty for unknown jobs.
  std::vector<std::string> Flagged(const std::string& job_id);

 private:
  struct Job {
    absl::flat_hash_set<std::string> hosts;
    std::map<int64_t, std::map<std::string, double>> pending;  // step -> host -> seconds
    std::map<std::string, int> slow_streak;
    std::set<std::string, NaturalOrder> flagged;  // worker-2 before worker-10
  };
  explicit StragglerDetector(Config config) : config_(config) {}
  bool Judge(Job& job, const std::map<std::string, double>& times);

  const Config config_;
  absl::Mutex mu_;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun::coordinator
