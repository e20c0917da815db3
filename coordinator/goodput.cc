#include "coordinator/goodput.h"

#include <algorithm>
#include <optional>

namespace meshrun::coordinator {
namespace {

// Walks a run's wall time from its start: each stretch taken goes to one bucket, so the
// buckets add up to the run's wall time. Points before where it stands (clock skew between
// hosts and the coordinator) take nothing; points past the run's end stop at it.
class Timeline {
 public:
  Timeline(absl::Time start, absl::Time end) : at_(start), end_(std::max(start, end)) {}

  // Seconds from where the timeline stands to `until`, moving there.
  double Take(absl::Time until) {
    until = std::min(until, end_);
    if (until <= at_) return 0;
    const double seconds = absl::ToDoubleSeconds(until - at_);
    at_ = until;
    return seconds;
  }
  double TakeSeconds(double seconds) { return Take(at_ + absl::Seconds(seconds)); }
  double TakeRest() { return Take(end_); }

 private:
  absl::Time at_;
  absl::Time end_;
};

std::optional<absl::Time> Entered(const v1::JobManifest& job, const char* state) {
  auto it = job.state_entered_unix_micros().find(state);
  if (it == job.state_entered_unix_micros().end()) return std::nullopt;
  return absl::FromUnixMicros(it->second);
}

// Blocking seconds of the run's checkpoints by step: those taken after its start step and
// recorded within [start, end] (a record without a time counts).
std::map<int64_t, double> CheckpointBlocking(const v1::JobManifest& job, int64_t base,
                                             absl::Time start, absl::Time end) {
  std::map<int64_t, double> blocking;
  for (const v1::CheckpointRecord& c : job.checkpoints()) {
    const absl::Time when = absl::FromUnixMicros(c.unix_micros());
    if (c.step() <= base || (c.unix_micros() != 0 && (when < start || when > end))) continue;
    blocking[c.step()] += std::max(0.0, c.blocking_seconds());
  }
  return blocking;
}

}  // namespace

void StepTimes::StartRun(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  runs_.erase(job_id);
}

void StepTimes::Add(const v1::GlobalSummary& summary) {
  absl::MutexLock lock(&mu_);
  histograms_.try_emplace(summary.job_id(), telemetry::StepTimeBuckets())
      .first->second.Observe(summary.step_time_seconds());
  std::vector<StepSample>& run = runs_[summary.job_id()];
  if (!run.empty() && summary.step() <= run.back().step) return;
  // A wait longer than the step is a malformed summary: it counts as the whole step.
  run.push_back({.step = summary.step(),
                 .done = absl::FromUnixMicros(summary.wall_time_unix_micros()),
                 .step_seconds = std::max(0.0, summary.step_time_seconds()),
                 .data_wait_seconds = std::clamp(summary.data_wait_seconds(), 0.0,
                                                 std::max(0.0, summary.step_time_seconds()))});
}

std::vector<StepSample> StepTimes::RunSamples(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = runs_.find(job_id);
  return it == runs_.end() ? std::vector<StepSample>{} : it->second;
}

std::map<std::string, telemetry::Histogram> StepTimes::Histograms() const {
  absl::MutexLock lock(&mu_);
  return histograms_;
}

void StepTimes::Forget(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  runs_.erase(job_id);
  histograms_.erase(job_id);
}

RunTime PartitionRun(const v1::JobManifest& job, absl::Span<const StepSample> steps,
                     absl::Time start, absl::Time end, int64_t kept_through, bool restarted) {
  RunTime out;
  auto& badput = out.badput;
  const int64_t base = std::max<int64_t>(job.restored_step(), 0);
  const std::string startup = base > 0 ? "restore" : "init";
  for (const char* cause : {"waiting_for_hosts", "compile", "executable_transfer",
                            "checkpoint_blocking", "data_wait", "rerun_steps", "other"}) {
    badput[cause] = 0;
  }
  badput[startup] = 0;
  Timeline timeline(start, end);
  // Before the steps: each state's stretch until the next state.
  std::string phase = "waiting_for_hosts";
  bool running = false;
  for (const auto& [state, next] : {std::pair<const char*, std::string>{"ASSIGNED", "compile"},
                                    {"LOADING", "executable_transfer"},
                                    {"RUNNING", startup}}) {
    const std::optional<absl::Time> entered = Entered(job, state);
    if (!entered.has_value()) break;
    badput[phase] += timeline.Take(*entered);
    phase = next;
    running = next == startup;
  }
  if (running && job.spec().telemetry().empty()) phase = "other";  // no step times
  if (running) {
    std::map<int64_t, double> blocking = CheckpointBlocking(job, base, start, end);
    int64_t previous = base;
    for (const StepSample& sample : steps) {
      if (sample.step <= previous) continue;
      const int64_t count = sample.step - previous;
      if (previous == base) {  // the first: its steps at its step time, startup before them
        badput[startup] += timeline.Take(
            sample.done - absl::Seconds(sample.step_seconds * static_cast<double>(count)));
      }
      const double length = timeline.Take(sample.done);
      // A checkpoint of step c blocks the step after it.
      double blocked = 0;
      for (auto it = blocking.lower_bound(previous); it != blocking.end() && it->first < sample.step;
           it = blocking.erase(it)) {
        blocked += it->second;
      }
      blocked = std::min(blocked, length);
      const double wait =
          std::min(sample.data_wait_seconds * static_cast<double>(count), length - blocked);
      const double rest = length - blocked - wait;
      const double kept = std::clamp(
          static_cast<double>(kept_through - previous) / static_cast<double>(count), 0.0, 1.0);
      badput["checkpoint_blocking"] += blocked;
      badput["data_wait"] += wait * kept;
      badput["rerun_steps"] += (rest + wait) * (1 - kept);
      out.productive += rest * kept;
      previous = sample.step;
    }
    if (previous > base) {
      // Checkpoints of the newest summarized step on block at the start of the tail.
      double blocked = 0;
      for (const auto& [step, seconds] : blocking) blocked += step >= previous ? seconds : 0;
      badput["checkpoint_blocking"] += timeline.TakeSeconds(blocked);
      phase = restarted ? "failure" : "other";
    }
  }
  badput[phase] += timeline.TakeRest();
  return out;
}

v1::JobGoodput ComputeGoodput(const v1::JobManifest& job, absl::Span<const StepSample> steps,
                              absl::Time now) {
  v1::JobGoodput out;
  const absl::Time created = absl::FromUnixMicros(job.created_unix_micros());
  const absl::Time end =
      job.finished_unix_micros() > 0 ? absl::FromUnixMicros(job.finished_unix_micros()) : now;
  const double wall = std::max(0.0, absl::ToDoubleSeconds(end - created));
  out.set_wall_seconds(wall);
  auto& badput = *out.mutable_badput_seconds();
  double productive = 0;
  // The runs that ended in a restart: their partitions, kept when they ended.
  absl::Time run_start = created;
  for (const v1::JobAttempt& run : job.attempts()) {
    const absl::Time run_end = absl::FromUnixMicros(run.end_unix_micros());
    double run_badput = 0;
    for (const auto& [cause, seconds] : run.badput_seconds()) {
      badput[cause] += seconds;
      run_badput += seconds;
    }
    productive += std::max(0.0, absl::ToDoubleSeconds(run_end - run_start) - run_badput);
    run_start = run_end;
  }
  const RunTime current = PartitionRun(job, steps, run_start, end,
                                       std::numeric_limits<int64_t>::max(), false);
  for (const auto& [cause, seconds] : current.badput) badput[cause] += seconds;
  productive += current.productive;
  out.set_productive_seconds(productive);
  out.set_ratio(wall > 0 ? productive / wall : 0);
  return out;
}

void FillGoodput(const StepTimes& times, absl::Time now, v1::JobManifest* job) {
  const std::vector<StepSample> steps = times.RunSamples(job->job_id());
  *job->mutable_goodput() = ComputeGoodput(*job, steps, now);
}

}  // namespace meshrun::coordinator
