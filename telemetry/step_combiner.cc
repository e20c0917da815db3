#include "telemetry/step_combiner.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace meshrun::telemetry {
namespace {

absl::StatusOr<Combine> FromProto(v1::Combine combine) {
  switch (combine) {
    case v1::COMBINE_MEAN: return Combine::kMean;
    case v1::COMBINE_MAX: return Combine::kMax;
    case v1::COMBINE_MIN: return Combine::kMin;
    case v1::COMBINE_SUM: return Combine::kSum;
    case v1::COMBINE_LAST: return Combine::kLast;
    default: break;
  }
  return absl::InvalidArgumentError("combine must be one of mean, max, min, sum, last");
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ","), "]");
}

}  // namespace

absl::StatusOr<std::unique_ptr<StepCombiner>> StepCombiner::Create(Config config) {
  if (config.clock == nullptr) return absl::InvalidArgumentError("StepCombiner: clock is null");
  if (!config.sink) return absl::InvalidArgumentError("StepCombiner: sink is not set");
  if (config.grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("StepCombiner: grace ", absl::FormatDuration(config.grace),
                     " is negative"));
  }
  if (config.max_pending_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "StepCombiner: max_pending_steps ", config.max_pending_steps, " must be >= 1"));
  }
  return std::unique_ptr<StepCombiner>(new StepCombiner(std::move(config)));
}

StepCombiner::~StepCombiner() = default;

absl::Status StepCombiner::StartJob(JobSetup setup) {
  if (setup.job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  if (setup.hosts.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("hosts of job ", setup.job_id, " is empty; a job needs at least one"));
  }
  if (setup.emitted_through_step < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "emitted_through_step ", setup.emitted_through_step, " is negative"));
  }
  Job job;
  job.hosts = setup.hosts;
  job.last_reported.assign(setup.hosts.size(), setup.emitted_through_step);
  job.emitted_through = setup.emitted_through_step;
  job.step_flops_per_device = setup.step_flops_per_device;
  job.peak_flops_per_device = setup.peak_flops_per_device;
  for (size_t i = 0; i < setup.hosts.size(); ++i) {
    const Host& host = setup.hosts[i];
    if (host.host.empty()) return absl::InvalidArgumentError(absl::StrCat("hosts[", i, "] is empty"));
    if (host.replica_count < 1) {
      return absl::InvalidArgumentError(absl::StrCat("hosts[", i, "] (", host.host,
                                                     ") replica_count ", host.replica_count,
                                                     " must be >= 1"));
    }
    if (!job.host_index.emplace(host.host, static_cast<int>(i)).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("hosts[", i, "] (", host.host, ") is listed twice"));
    }
  }
  for (size_t i = 0; i < setup.declarations.size(); ++i) {
    const v1::TelemetryDeclaration& decl = setup.declarations[i];
    const std::string field = absl::StrCat("telemetry[", i, "]");
    if (decl.name().empty()) return absl::InvalidArgumentError(absl::StrCat(field, ".name is empty"));
    Series series;
    series.name = decl.name();
    for (int64_t dim : decl.shape()) {
      if (dim < 1) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".shape of \"", decl.name(),
                                                       "\" has dimension ", dim,
                                                       "; dimensions must be >= 1"));
      }
      series.shape.push_back(dim);
      series.elements *= dim;
    }
    auto combine = FromProto(decl.combine());
    if (!combine.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".combine of \"", decl.name(), "\": ",
                                                     combine.status().message()));
    }
    series.combine = *combine;
    if (!job.series_index.emplace(series.name, static_cast<int>(job.series.size())).second) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name \"", decl.name(), "\" is declared twice"));
    }
    job.series.push_back(std::move(series));
  }
  absl::MutexLock l(&mu_);
  if (jobs_.count(setup.job_id) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("telemetry of job ", setup.job_id, " is already being combined"));
  }
  jobs_.emplace(setup.job_id, std::move(job));
  return absl::OkStatus();
}

absl::Status StepCombiner::Validate(const Job& job, const v1::HostSummary& summary) const {
  if (summary.step() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("step ", summary.step(), " of job ", summary.job_id(), " must be >= 1"));
  }
  auto host = job.host_index.find(summary.host());
  if (host == job.host_index.end()) {
    return absl::InvalidArgumentError(absl::StrCat("host \"", summary.host(),
                                                   "\" is not a host of job ", summary.job_id()));
  }
  const int replicas = job.hosts[host->second].replica_count;
  if (summary.replica_count() != 0 && summary.replica_count() != replicas) {
    return absl::InvalidArgumentError(absl::StrCat(
        "replica_count ", summary.replica_count(), " of host ", summary.host(),
        " differs from the job's ", replicas));
  }
  for (const auto& [field, seconds] : {std::pair{"step_time_seconds", summary.step_time_seconds()},
                                        std::pair{"data_wait_seconds", summary.data_wait_seconds()}}) {
    if (!std::isfinite(seconds) || seconds < 0) {
      return absl::InvalidArgumentError(absl::StrCat(field, " ", seconds, " of host ",
                                                     summary.host(), " must be finite and >= 0"));
    }
  }
  std::vector<bool> seen(job.series.size(), false);
  for (int i = 0; i < summary.values_size(); ++i) {
    const v1::TelemetryValue& value = summary.values(i);
    const std::string field = absl::StrCat("values[", i, "]");
    auto index = job.series_index.find(value.name());
    if (index == job.series_index.end()) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".name \"", value.name(),
                                                     "\" is not declared by job ",
                                                     summary.job_id()));
    }
    if (seen[index->second]) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ".name \"", value.name(), "\" appears twice"));
    }
    seen[index->second] = true;
    const Series& series = job.series[index->second];
    const std::vector<int64_t> shape(value.shape().begin(), value.shape().end());
    if (shape != series.shape) {
      return absl::InvalidArgumentError(absl::StrCat(field, ".shape ", ShapeString(shape),
                                                     " of \"", value.name(),
                                                     "\" differs from the declared ",
                                                     ShapeString(series.shape)));
    }
    if (value.values_size() != series.elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, ".values of \"", value.name(), "\" has ", value.values_size(),
          " elements; the declared shape ", ShapeString(series.shape), " has ", series.elements));
    }
  }
  for (size_t s = 0; s < job.series.size(); ++s) {
    if (!seen[s]) {
      return absl::InvalidArgumentError(absl::StrCat("values: declared series \"",
                                                     job.series[s].name, "\" is missing from host ",
                                                     summary.host(), " at step ", summary.step()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<StepCombiner::AddOutcome> StepCombiner::Add(v1::HostSummary&& summary) {
  AddOutcome outcome = AddOutcome::kAccepted;
  bool deliver = false;
  {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(summary.job_id());
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("job_id \"", summary.job_id(),
                                              "\" has no telemetry being combined"));
    }
    Job& job = it->second;
    RETURN_IF_ERROR(Validate(job, summary));
    const int host = job.host_index.at(summary.host());
    const absl::Time now = config_.clock->Now();
    int64_t& host_last = job.last_reported[host];
    if (summary.step() <= job.emitted_through) {
      // Hosts send in step order, so a host that reported a later step has sent this one.
      return summary.step() <= host_last ? AddOutcome::kDuplicate : AddOutcome::kLate;
    }
    host_last = std::max(host_last, summary.step());
    auto pending = job.pending.find(summary.step());
    if (pending == job.pending.end()) {
      pending = job.pending.emplace(summary.step(), PendingStep{now + config_.grace, {}}).first;
    }
    if (!pending->second.by_host.try_emplace(host, std::move(summary)).second) {
      outcome = AddOutcome::kDuplicate;
    }
    // Bound memory: force the oldest steps out when too many pend.
    while (static_cast<int>(job.pending.size()) > config_.max_pending_steps) {
      auto oldest = job.pending.begin();
      EmitLocked(it->first, job, oldest->first, oldest->second);
      job.pending.erase(oldest);
    }
    CollectLocked(it->first, job, now, /*force=*/false);
    deliver = ClaimDeliveryLocked();
  }
  if (deliver) DeliverClaimed();
  return outcome;
}

void StepCombiner::Poll() {
  bool deliver = false;
  {
    absl::MutexLock l(&mu_);
    const absl::Time now = config_.clock->Now();
    for (auto& [job_id, job] : jobs_) CollectLocked(job_id, job, now, /*force=*/false);
    deliver = ClaimDeliveryLocked();
  }
  if (deliver) DeliverClaimed();
}

std::optional<absl::Time> StepCombiner::NextDeadline() const {
  absl::MutexLock l(&mu_);
  std::optional<absl::Time> next;
  for (const auto& [job_id, job] : jobs_) {
    // Steps leave in order, so only the first pending step's deadline can release anything.
    if (job.pending.empty()) continue;
    const absl::Time deadline = job.pending.begin()->second.deadline;
    if (!next || deadline < *next) next = deadline;
  }
  return next;
}

absl::Status StepCombiner::FinishJob(const std::string& job_id) {
  bool deliver = false;
  {
    absl::MutexLock l(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("job_id \"", job_id, "\" has no telemetry being combined"));
    }
    CollectLocked(job_id, it->second, config_.clock->Now(), /*force=*/true);
    jobs_.erase(it);
    deliver = ClaimDeliveryLocked();
  }
  if (deliver) DeliverClaimed();
  return absl::OkStatus();
}

absl::StatusOr<int64_t> StepCombiner::AbandonJob(const std::string& job_id) {
  absl::MutexLock l(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job_id \"", job_id, "\" has no telemetry being combined"));
  }
  const int64_t emitted = it->second.emitted_through;
  jobs_.erase(it);
  return emitted;
}

absl::StatusOr<int64_t> StepCombiner::LastEmittedStep(const std::string& job_id) const {
  absl::MutexLock l(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job_id \"", job_id, "\" has no telemetry being combined"));
  }
  return it->second.emitted_through;
}

absl::StatusOr<int> StepCombiner::PendingSteps(const std::string& job_id) const {
  absl::MutexLock l(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("job_id \"", job_id, "\" has no telemetry being combined"));
  }
  return static_cast<int>(it->second.pending.size());
}

void StepCombiner::CollectLocked(const std::string& job_id, Job& job, absl::Time now,
                                 bool force) {
  while (!job.pending.empty()) {
    auto it = job.pending.begin();
    const bool complete = it->second.by_host.size() == job.hosts.size();
    if (!complete && !force && now < it->second.deadline) break;
    EmitLocked(job_id, job, it->first, it->second);
    job.pending.erase(it);
  }
}

void StepCombiner::EmitLocked(const std::string& job_id, Job& job, int64_t step,
                              PendingStep& pending) {
  v1::GlobalSummary global;
  global.set_job_id(job_id);
  global.set_step(step);
  for (size_t h = 0; h < job.hosts.size(); ++h) {
    if (pending.by_host.count(static_cast<int>(h)) == 0) {
      global.add_missing_hosts(job.hosts[h].host);
    }
  }
  global.set_partial(global.missing_hosts_size() > 0);
  double step_time = 0, data_wait = 0;
  int64_t wall_time = 0;
  bool synthetic = false;
  for (const auto& [host, summary] : pending.by_host) {
    step_time = std::max(step_time, summary.step_time_seconds());
    data_wait = std::max(data_wait, summary.data_wait_seconds());
    wall_time = std::max(wall_time, summary.wall_time_unix_micros());
    synthetic = synthetic || summary.synthetic_data();
  }
  global.set_step_time_seconds(step_time);
  if (step_time > 0 && job.step_flops_per_device > 0) {
    const double flops_per_second = job.step_flops_per_device / step_time;
    global.set_tflops_per_device(flops_per_second / 1e12);
    if (job.peak_flops_per_device > 0) global.set_mfu(flops_per_second / job.peak_flops_per_device);
  }
  global.set_data_wait_seconds(data_wait);
  global.set_wall_time_unix_micros(wall_time);
  global.set_synthetic_data(synthetic);
  for (const Series& series : job.series) {
    std::vector<HostValues> inputs;
    inputs.reserve(pending.by_host.size());
    bool exceeded = false;
    for (const auto& [host, summary] : pending.by_host) {
      for (const v1::TelemetryValue& value : summary.values()) {
        if (value.name() != series.name) continue;
        inputs.push_back(HostValues{host, job.hosts[host].replica_count,
                                    std::vector<float>(value.values().begin(),
                                                       value.values().end())});
        exceeded = exceeded || value.threshold_exceeded();
        break;
      }
    }
    v1::TelemetryValue* out = global.add_values();
    out->set_name(series.name);
    for (int64_t dim : series.shape) out->add_shape(dim);
    out->set_threshold_exceeded(exceeded);
    // Validation guarantees one input per reporting host with the declared element count, and
    // a pending step has at least one host, so CombineValues cannot fail here.
    auto combined = CombineValues(series.combine, inputs);
    if (combined.ok()) {
      for (float v : *combined) out->add_values(v);
    }
  }
  for (auto& [host, summary] : pending.by_host) {
    *global.add_host_detail() = std::move(summary);
  }
  job.emitted_through = step;
  outbox_.push_back(std::move(global));
}

bool StepCombiner::ClaimDeliveryLocked() {
  if (delivering_ || outbox_.empty()) return false;
  delivering_ = true;
  return true;
}

void StepCombiner::DeliverClaimed() {
  while (true) {
    std::deque<v1::GlobalSummary> batch;
    {
      absl::MutexLock l(&mu_);
      if (outbox_.empty()) {
        delivering_ = false;
        return;
      }
      batch.swap(outbox_);
    }
    for (v1::GlobalSummary& global : batch) config_.sink(std::move(global));
  }
}

}  // namespace meshrun::telemetry
