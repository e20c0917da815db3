#include "coordinator/goodput.h"

#include <algorithm>

namespace meshrun::coordinator {
double PhaseSeconds(const v1::JobManifest& job, const char* from, const char* to,
                    absl::Time end) {
  const auto& entered = job.state_entered_unix_micros();
  auto a = entered.find(from), b = entered.find(to);
  if (a == entered.end()) return 0;
  const int64_t until = b != entered.end() ? b->second : absl::ToUnixMicros(end);
  return until < a->second ? 0 : static_cast<double>(until - a->second) / 1e6;
}

void StepTimes::Add(const v1::GlobalSummary& summary) {
  absl::MutexLock lock(&mu_);
  StepTiming& t = jobs_[summary.job_id()];
  std::map<int64_t, Sample>& steps = steps_[summary.job_id()];
  const absl::Time wall = absl::FromUnixMicros(summary.wall_time_unix_micros());
  bool rewound = false;
  if (!steps.empty() && summary.step() <= t.last_step) {
    rewound = true;
    // A rewind: the steps from here on are computed again; what they took before is badput.
    const double mean = t.sampled_seconds / static_cast<double>(std::max<int64_t>(t.samples, 1));
    const int64_t lost = t.last_step - summary.step() + 1;
    t.rerun_seconds += mean * static_cast<double>(lost);
    for (auto it = steps.lower_bound(summary.step()); it != steps.end();) {
      t.sampled_seconds -= it->second.step_seconds;
      t.sampled_data_wait -= it->second.data_wait_seconds;
      --t.samples;
      it = steps.erase(it);
    }
    t.last_step = summary.step() - 1;
  }
  if (steps.empty() || rewound) {  // the first step of this run's summaries
    t.first_step = summary.step();
    t.first_step_wall = wall;
    t.first_step_seconds = summary.step_time_seconds();
  }
  // A wait longer than the step is a malformed summary: it counts as the whole step.
  const double data_wait = std::min(summary.data_wait_seconds(), summary.step_time_seconds());
  steps[summary.step()] = {summary.step_time_seconds(), data_wait};
  histograms_.try_emplace(summary.job_id(), telemetry::StepTimeBuckets())
      .first->second.Observe(summary.step_time_seconds());
  t.sampled_seconds += summary.step_time_seconds();
  t.sampled_data_wait += data_wait;
  ++t.samples;
  t.last_step = std::max(t.last_step, summary.step());
}

std::optional<StepTiming> StepTimes::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second.samples == 0) return std::nullopt;
  return it->second;
}

std::map<std::string, telemetry::Histogram> StepTimes::Histograms() const {
  absl::MutexLock lock(&mu_);
  return histograms_;
}

void StepTimes::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
  steps_.erase(job_id);
  histograms_.erase(job_id);
}

v1::JobGoodput ComputeGoodput(const v1::JobManifest& job, const StepTiming* timing,
                              absl::Time now) {
  v1::JobGoodput out;
  const absl::Time created = absl::FromUnixMicros(job.created_unix_micros());
  const absl::Time end =
      job.finished_unix_micros() > 0 ? absl::FromUnixMicros(job.finished_unix_micros()) : now;
  const double wall = std::max(0.0, absl::ToDoubleSeconds(end - created));
  out.set_wall_seconds(wall);
  auto& badput = *out.mutable_badput_seconds();
  badput["waiting_for_hosts"] = PhaseSeconds(job, "PENDING", "ASSIGNED", end);
  badput["compile"] = job.compile_seconds();
  badput["executable_transfer"] = PhaseSeconds(job, "LOADING", "RUNNING", end);
  for (const v1::JobAttempt& run : job.attempts()) {  // the runs that ended in a restart
    for (const auto& [cause, seconds] : run.badput_seconds()) badput[cause] += seconds;
  }
  double blocking = 0;
  for (const v1::CheckpointRecord& c : job.checkpoints()) blocking += c.blocking_seconds();
  badput["checkpoint_blocking"] = blocking;
  const char* startup = job.restored_step() > 0 ? "restore" : "init";
  badput[startup] = 0;
  badput["rerun_steps"] = 0;
  badput["data_wait"] = 0;
  double productive = 0;
  if (timing != nullptr && timing->samples > 0) {
    const double mean = timing->sampled_seconds / static_cast<double>(timing->samples);
    // Steps before the first summarized one (cadence > 1) at the mean step time. The steps
    // kept count from where the first run started; this run's startup from where it did.
    const int64_t base = std::max<int64_t>(job.restored_step(), 0);
    const int64_t first_base =
        job.attempts_size() > 0 ? std::max<int64_t>(job.attempts(0).start_step(), 0) : base;
    const int64_t kept = std::max<int64_t>(timing->last_step - first_base, 0);
    // Waiting for batches is part of each step's time but not productive.
    const double mean_wait =
        timing->sampled_data_wait / static_cast<double>(timing->samples);
    productive = (mean - mean_wait) * static_cast<double>(kept);
    badput["data_wait"] = mean_wait * static_cast<double>(kept);
    badput["rerun_steps"] = timing->rerun_seconds;
    // Running until the first step started: init, or the checkpoint's restore.
    auto running = job.state_entered_unix_micros().find("RUNNING");
    if (running != job.state_entered_unix_micros().end()) {
      const absl::Time first_start =
          timing->first_step_wall - absl::Seconds(timing->first_step_seconds) -
          absl::Seconds(mean * static_cast<double>(std::max<int64_t>(
                                   timing->first_step - base - 1, 0)));
      badput[startup] = std::max(
          0.0, absl::ToDoubleSeconds(first_start - absl::FromUnixMicros(running->second)));
    }
  }
  productive = std::min(productive, wall);
  out.set_productive_seconds(productive);
  double accounted = productive;
  for (const auto& [cause, seconds] : badput) accounted += seconds;
  badput["other"] = std::max(0.0, wall - accounted);
  out.set_ratio(wall > 0 ? productive / wall : 0);
  return out;
}

void FillGoodput(const StepTimes& times, absl::Time now, v1::JobManifest* job) {
  const std::optional<StepTiming> timing = times.Get(job->job_id());
  *job->mutable_goodput() = ComputeGoodput(*job, timing ? &*timing : nullptr, now);
}

}  // namespace meshrun::coordinator
