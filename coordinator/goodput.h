// Goodput (docs/checkpoints.md, "Goodput"): the share of a job's wall time spent in training
// steps that count, and badput by cause, computed by the coordinator from its own timestamps:
// when the job entered each state (JobManifest.state_entered_unix_micros), its compile time,
// its checkpoints' blocking time, and the step times its combined telemetry summaries carry
// (StepTimes, fed by the telemetry sink).
//
// Steps between two summaries (cadence > 1) are counted at the mean step time of the summaries
// seen. A summary for a step at or below one already seen is a rewind (a job restored from a
// checkpoint and re-running steps): the steps it re-runs are badput "rerun_steps", each step
// counts once in productive time. The part of the steps' time spent waiting for batches
// (GlobalSummary.data_wait_seconds, sampled the same way) is badput "data_wait".
//
// A job restarted automatically (JobManifest.attempts) adds up its runs: each ended run's
// waiting, compile and transfer as JobAttempt.badput_seconds kept them, the current run's from
// its state times; productive time counts the steps kept from the first run's start step. An
// ended run's init or restore time is not kept ("other").
//
// StepTimes also counts each summary's step time into a per-job histogram (the fixed
// telemetry::StepTimeBuckets(), for /metrics): one observation per summarized step, re-run steps
// included (they ran), so its counts only grow.
//
// StepTimes lives in memory: after a coordinator restart a running job's goodput and histogram
// count only the summaries since.
//
// Thread-safety: StepTimes is safe to use concurrently; ComputeGoodput is a pure function.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "meshrun/v1/job.pb.h"
#include "meshrun/v1/telemetry.pb.h"
#include "telemetry/prometheus.h"

namespace meshrun::coordinator {

// What the summaries of one job said about its steps.
struct StepTiming {
  int64_t first_step = 0;            // the first step summarized (since the last rewind)
  absl::Time first_step_wall;        // when that summary was made
  double first_step_seconds = 0;     // its step time
  int64_t last_step = 0;             // the newest step summarized
  int64_t samples = 0;               // summaries kept (one per summarized step)
  double sampled_seconds = 0;        // their step times
  double sampled_data_wait = 0;      // the part of them spent waiting for batches
  double rerun_seconds = 0;          // step time spent on steps a rewind discarded
};

class StepTimes {
 public:
  // Records one combined summary (its step and step time).
  void Add(const v1::GlobalSummary& summary);
  std::optional<StepTiming> Get(const std::string& job_id) const;
  // Every job's step-time histogram, by job id (jobs with no summary yet are absent).
  std::map<std::string, telemetry::Histogram> Histograms() const;

  // Drops the job's timings (a pruned job).
  void Forget(const std::string& job_id);

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, StepTiming> jobs_ ABSL_GUARDED_BY(mu_);
  struct Sample {
    double step_seconds = 0;
    double data_wait_seconds = 0;
  };
  // Per job, the summarized steps' times since the last rewind (so a rewind knows what it
  // discards).
  std::map<std::string, std::map<int64_t, Sample>> steps_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, telemetry::Histogram> histograms_ ABSL_GUARDED_BY(mu_);
};

// Seconds the job's current run spent from entering state `from` to entering `to`, or to
// `end` when the run never entered `to` (it is still there, or ended there); 0 when it never
// entered `from`. State names as JobStateName.
double PhaseSeconds(const v1::JobManifest& job, const char* from, const char* to, absl::Time end);

// The goodput of `job` at `now` (its end when it has ended). `timing` may be null (no step
// summarized yet: productive time 0).
v1::JobGoodput ComputeGoodput(const v1::JobManifest& job, const StepTiming* timing,
                              absl::Time now);

// Sets job->goodput from `times` at `now`.
void FillGoodput(const StepTimes& times, absl::Time now, v1::JobManifest* job);

}  // namespace meshrun::coordinator
