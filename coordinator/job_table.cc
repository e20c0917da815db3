#include "coordinator/job_table.h"

#include <algorithm>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "coordinator/goodput.h"

namespace meshrun::coordinator {

using jobspec::IsFinal;
using jobspec::JobStateName;

absl::Status CheckJobMember(const v1::JobManifest& job, const std::string& host,
                            const std::string& incarnation) {
  auto member = job.host_incarnations().find(host);
  if (member == job.host_incarnations().end() || member->second != incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker ", host, " incarnation ", incarnation, " is not part of job ", job.job_id()));
  }
  return absl::OkStatus();
}

namespace {

bool IsLegal(v1::JobState from, v1::JobState to) {
  if (IsFinal(from)) return false;
  if (to == v1::JOB_STATE_FAILED || to == v1::JOB_STATE_CANCELLED) return true;
  switch (from) {
    case v1::JOB_STATE_PENDING: return to == v1::JOB_STATE_ASSIGNED;
    case v1::JOB_STATE_ASSIGNED: return to == v1::JOB_STATE_LOADING;
    case v1::JOB_STATE_LOADING: return to == v1::JOB_STATE_RUNNING;
    case v1::JOB_STATE_RUNNING: return to == v1::JOB_STATE_SUCCEEDED;
    default: return false;
  }
}

}  // namespace

v1::JobManifest RestoredAfterRestart(v1::JobManifest job, absl::Time now) {
  if (!IsFinal(job.state()) && job.state() != v1::JOB_STATE_RUNNING) {
    job.set_error(absl::StrCat("the coordinator restarted while the job was ",
                               JobStateName(job.state()), "; resubmit it"));
    job.set_state(v1::JOB_STATE_FAILED);
    job.set_finished_unix_micros(absl::ToUnixMicros(now));
  }
  return job;
}

absl::StatusOr<std::unique_ptr<JobTable>> JobTable::Create(Config config) {
  if (config.clock == nullptr) return absl::InvalidArgumentError("clock must not be null");
  std::vector<std::pair<int64_t, v1::JobManifest>> restored;
  for (v1::JobManifest& job : config.restored) {
    int64_t n = 0;
    if (!absl::StartsWith(job.job_id(), "job-") || !absl::SimpleAtoi(job.job_id().substr(4), &n)) {
      return absl::InvalidArgumentError(
          absl::StrCat("restored job id \"", job.job_id(), "\" is not job-<n>"));
    }
    config.first_id = std::max(config.first_id, n + 1);
    restored.emplace_back(n, std::move(job));
  }
  config.restored.clear();
  std::sort(restored.begin(), restored.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::unique_ptr<JobTable> table(new JobTable(std::move(config)));
  absl::MutexLock lock(&table->mu_);
  for (auto& [n, job] : restored) {
    table->order_.push_back(job.job_id());
    table->jobs_[job.job_id()] = std::move(job);
  }
  return table;
}

void JobTable::ChangedLocked(const v1::JobManifest& job) {
  if (config_.on_change) config_.on_change(job);
}

std::string JobTable::Add(const v1::JobSpec& spec) {
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrCat("job-", next_id_++);
  v1::JobManifest& job = jobs_[id];
  job.set_job_id(id);
  *job.mutable_spec() = spec;
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_created_unix_micros(absl::ToUnixMicros(config_.clock->Now()));
  (*job.mutable_state_entered_unix_micros())[JobStateName(job.state())] =
      job.created_unix_micros();
  order_.push_back(id);
  ChangedLocked(job);
  return id;
}

absl::Status JobTable::TransitionLocked(v1::JobManifest& job, v1::JobState to) {
  if (!IsLegal(job.state(), to)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.job_id(), " is ",
                                                      JobStateName(job.state()),
                                                      "; it cannot become ", JobStateName(to)));
  }
  job.set_state(to);
  (*job.mutable_state_entered_unix_micros())[JobStateName(to)] =
      absl::ToUnixMicros(config_.clock->Now());
  if (IsFinal(to)) job.set_finished_unix_micros(absl::ToUnixMicros(config_.clock->Now()));
  return absl::OkStatus();
}

absl::Status JobTable::Transition(const std::string& job_id, v1::JobState to,
                                  std::optional<int> attempts) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  if (attempts.has_value() && it->second.attempts_size() != *attempts) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " restarted since run ",
                                           *attempts + 1));
  }
  RETURN_IF_ERROR(TransitionLocked(it->second, to));
  ChangedLocked(it->second);
  return absl::OkStatus();
}

absl::Status JobTable::Fail(const std::string& job_id, const std::string& host,
                            const std::string& error) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  if (absl::Status s = TransitionLocked(it->second, v1::JOB_STATE_FAILED); !s.ok()) return s;
  it->second.set_failed_host(host);
  it->second.set_error(error);
  ChangedLocked(it->second);
  return absl::OkStatus();
}

absl::Status JobTable::Restart(const std::string& job_id, const std::string& host,
                               const std::string& cause, const std::string& resume_from,
                               int64_t restored_step, int expected_attempts,
                               absl::Span<const StepSample> run_steps,
                               const v1::MemoryRestore& memory) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  v1::JobManifest& job = it->second;
  if (IsFinal(job.state())) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ended ", JobStateName(job.state())));
  }
  if (job.attempts_size() != expected_attempts) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " restarted meanwhile (run ",
                                           job.attempts_size() + 1, ")"));
  }
  const absl::Time now = config_.clock->Now();
  const int64_t start = job.attempts_size() > 0
                            ? job.attempts(job.attempts_size() - 1).end_unix_micros()
                            : job.created_unix_micros();
  // The states' times are the run's: partition the run's wall time while they are here, then
  // start the next run's from its PENDING (else its waiting would span this whole run).
  const RunTime ended = PartitionRun(job, run_steps, absl::FromUnixMicros(start), now,
                                     restored_step, /*restarted=*/true);
  v1::JobAttempt* attempt = job.add_attempts();
  attempt->set_start_unix_micros(start);
  attempt->set_end_unix_micros(absl::ToUnixMicros(now));
  attempt->set_start_step(job.restored_step());
  attempt->mutable_badput_seconds()->insert(ended.badput.begin(), ended.badput.end());
  job.clear_compile_seconds();
  job.mutable_state_entered_unix_micros()->clear();
  (*job.mutable_state_entered_unix_micros())["PENDING"] = absl::ToUnixMicros(now);
  attempt->set_cause(cause);
  attempt->set_host(host);
  attempt->set_last_step(job.last_step());
  attempt->set_restored_step(restored_step);
  attempt->set_steps_lost(std::max<int64_t>(0, job.last_step() - restored_step));
  attempt->set_restored_from(memory.step() > 0 ? "memory" : "disk");
  for (const auto& [member, incarnation] : job.host_incarnations()) attempt->add_hosts(member);
  std::sort(attempt->mutable_hosts()->begin(), attempt->mutable_hosts()->end());
  job.set_state(v1::JOB_STATE_PENDING);
  job.mutable_spec()->set_resume_from(resume_from);
  *job.mutable_memory_restore() = memory;
  job.set_restored_step(restored_step);
  job.set_last_step(restored_step);
  job.clear_mesh();
  job.clear_host_incarnations();
  job.clear_host_runtime_versions();
  ChangedLocked(job);
  return absl::OkStatus();
}

absl::Status JobTable::Cancel(const std::string& job_id) {
  return Transition(job_id, v1::JOB_STATE_CANCELLED);
}

absl::Status JobTable::Update(const std::string& job_id,
                              const std::function<void(v1::JobManifest&)>& edit) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  const v1::JobState state = it->second.state();
  edit(it->second);
  it->second.set_job_id(job_id);
  it->second.set_state(state);
  ChangedLocked(it->second);
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::string>> JobTable::HostIncarnations(
    const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  return std::map<std::string, std::string>(it->second.host_incarnations().begin(),
                                            it->second.host_incarnations().end());
}

absl::StatusOr<std::optional<std::string>> JobTable::HostIncarnation(
    const std::string& job_id, const std::string& host) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  auto member = it->second.host_incarnations().find(host);
  if (member == it->second.host_incarnations().end()) return std::nullopt;
  return member->second;
}

absl::StatusOr<std::string> JobTable::TelemetryRelayOf(const std::string& job_id,
                                                       const std::string& host) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  auto relay = it->second.telemetry_relays().find(host);
  return relay == it->second.telemetry_relays().end() ? std::string() : relay->second;
}

absl::StatusOr<v1::JobManifest> JobTable::Get(const std::string& job_id) const {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  return it->second;
}

std::vector<v1::JobManifest> JobTable::List() const {
  absl::MutexLock lock(&mu_);
  std::vector<v1::JobManifest> jobs;
  jobs.reserve(order_.size());
  for (const std::string& id : order_) jobs.push_back(jobs_.at(id));
  return jobs;
}

std::vector<std::string> JobTable::FailJobsOnWorker(const std::string& host,
                                                    const std::string& incarnation,
                                                    const std::string& error) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> failed;
  for (auto& [id, job] : jobs_) {
    if (IsFinal(job.state())) continue;
    auto it = job.host_incarnations().find(host);
    if (it == job.host_incarnations().end() || it->second != incarnation) continue;
    if (TransitionLocked(job, v1::JOB_STATE_FAILED).ok()) {
      job.set_failed_host(host);
      job.set_error(error);
      ChangedLocked(job);
      failed.push_back(id);
    }
  }
  return failed;
}

int64_t JobTable::FinishedCount() const {
  absl::MutexLock lock(&mu_);
  return absl::c_count_if(jobs_, [](const auto& entry) { return IsFinal(entry.second.state()); });
}

std::vector<std::string> JobTable::PruneFinished(absl::Duration retention,
                                                 int64_t max_finished) {
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<int64_t, std::string>> finished;  // (finished at, id), earliest first
  for (const auto& [id, job] : jobs_) {
    if (IsFinal(job.state())) finished.emplace_back(job.finished_unix_micros(), id);
  }
  std::sort(finished.begin(), finished.end());
  const int64_t cutoff = absl::ToUnixMicros(config_.clock->Now() - retention);
  size_t drop = 0;
  while (drop < finished.size() && retention > absl::ZeroDuration() &&
         finished[drop].first < cutoff) {
    ++drop;
  }
  if (max_finished > 0 && finished.size() - drop > static_cast<size_t>(max_finished)) {
    drop = finished.size() - static_cast<size_t>(max_finished);
  }
  std::vector<std::string> pruned;
  for (size_t i = 0; i < drop; ++i) {
    jobs_.erase(finished[i].second);
    pruned.push_back(finished[i].second);
  }
  if (!pruned.empty()) {
    const absl::flat_hash_set<std::string> gone(pruned.begin(), pruned.end());
    order_.erase(std::remove_if(order_.begin(), order_.end(),
                                [&gone](const std::string& id) { return gone.contains(id); }),
                 order_.end());
  }
  return pruned;
}

}  // namespace meshrun::coordinator
