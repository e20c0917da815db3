// Goodput (docs/goodput.md): the share of a job's wall time spent in training steps that count,
// and badput by cause, computed by the coordinator from its own timestamps (when the job's run
// entered each state, JobManifest.state_entered_unix_micros), its checkpoints' blocking time,
// and when each summarized step completed (the combined telemetry summaries, fed by the
// telemetry sink into StepTimes).
//
// The wall time is partitioned, never summed from step times: each second from submit until the
// job ended (or now) falls in exactly one bucket, so productive + Σ badput = wall time and the
// ratio cannot pass 1. Per run of the job (a restart by automatic recovery starts a new run):
//
//   run start ─ waiting_for_hosts ─ ASSIGNED ─ compile ─ LOADING ─ executable_transfer ─ RUNNING
//     ─ init | restore ─ first step starts ─ steps ─ newest summarized step ─ tail ─ run end
//
// Between two consecutive summaries (steps a < b) lies the wall time of steps a+1..b: the
// blocking of checkpoints taken there is checkpoint_blocking, the summary's data wait times
// b - a is data_wait, the rest productive; steps after the checkpoint the next run restarted
// from are rerun_steps (their data wait included). The first summarized step's steps before it
// count at its step time; what comes before them is init (or restore). The tail after the newest
// summary is "failure" for a run that ended in a restart (steps lost with it, detection and
// re-planning), else "other" (shutdown; for a running job, steps not summarized yet). A running
// job without telemetry has no step times: its running time is "other".
//
// A restarted run's partition is made when it ends (JobTable::Restart) and kept in its
// JobAttempt.badput_seconds; its productive time is its wall time less those.
//
// StepTimes also counts each summary's step time into a per-job histogram (the fixed
// telemetry::StepTimeBuckets(), for /metrics): one observation per summarized step, re-run
// steps included (they ran), so its counts only grow.
//
// StepTimes lives in memory and keeps one sample per summary of each job's current run: after
// a coordinator restart a running job's steps before its first summary since count at that
// summary's step time.
//
// Thread-safety: StepTimes is safe to use concurrently; the functions are pure.
#pragma once

#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "meshrun/v1/job.pb.h"
#include "meshrun/v1/telemetry.pb.h"
#include "telemetry/prometheus.h"

namespace meshrun::coordinator {

// One combined summary: when its step completed (the latest host's), its step time and the
// part of it spent waiting for the batch (the longest host's).
struct StepSample {
  int64_t step = 0;
  absl::Time done;
  double step_seconds = 0;
  double data_wait_seconds = 0;
};

class StepTimes {
 public:
  // Starts the job's current run: the samples of the run before it go (see JobTable::Restart,
  // which partitions that run first).
  void StartRun(const std::string& job_id);
  // Records one combined summary. A step not after the run's newest is ignored (a run's steps
  // only grow; the histogram still counts it).
  void Add(const v1::GlobalSummary& summary);
  // The current run's samples, in step order.
  std::vector<StepSample> RunSamples(const std::string& job_id) const;
  // Every job's step-time histogram, by job id (jobs with no summary yet are absent).
  std::map<std::string, telemetry::Histogram> Histograms() const;

  // Drops the job's timings (a pruned job).
  void Forget(const std::string& job_id);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::vector<StepSample>> runs_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, telemetry::Histogram> histograms_ ABSL_GUARDED_BY(mu_);
};

// One run's wall time, partitioned: productive seconds and badput seconds by cause.
struct RunTime {
  double productive = 0;
  std::map<std::string, double> badput;
};

// Partitions the job's current run, [start, end): its state times and checkpoints from `job`,
// its summaries `steps` (in step order; those at or before job.restored_step() are ignored).
// Steps after `kept_through` are rerun_steps. `restarted`: the run ended in a restart (its tail
// is "failure"). End before start: an empty partition.
RunTime PartitionRun(const v1::JobManifest& job, absl::Span<const StepSample> steps,
                     absl::Time start, absl::Time end, int64_t kept_through, bool restarted);

// The goodput of `job` at `now` (its end when it has ended): its ended runs' partitions from
// its attempts, the current run's from `steps` (StepTimes::RunSamples).
v1::JobGoodput ComputeGoodput(const v1::JobManifest& job, absl::Span<const StepSample> steps,
                              absl::Time now);

// Sets job->goodput from `times` at `now`.
void FillGoodput(const StepTimes& times, absl::Time now, v1::JobManifest* job);

}  // namespace meshrun::coordinator
