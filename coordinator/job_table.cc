#include "coordinator/job_table.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace meshrun::coordinator {

const char* JobStateName(v1::JobState state) {
  switch (state) {
    case v1::JOB_STATE_PENDING: return "PENDING";
    case v1::JOB_STATE_ASSIGNED: return "ASSIGNED";
    case v1::JOB_STATE_LOADING: return "LOADING";
    case v1::JOB_STATE_RUNNING: return "RUNNING";
    case v1::JOB_STATE_SUCCEEDED: return "SUCCEEDED";
    case v1::JOB_STATE_FAILED: return "FAILED";
    case v1::JOB_STATE_CANCELLED: return "CANCELLED";
    default: return "UNSPECIFIED";
  }
}

bool IsFinal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_CANCELLED;
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

absl::StatusOr<std::unique_ptr<JobTable>> JobTable::Create(Config config) {
  if (config.clock == nullptr) return absl::InvalidArgumentError("clock must not be null");
  return std::unique_ptr<JobTable>(new JobTable(config));
}

std::string JobTable::Add(const v1::JobSpec& spec) {
  absl::MutexLock lock(&mu_);
  const std::string id = absl::StrCat("job-", next_id_++);
  v1::JobManifest& job = jobs_[id];
  job.set_job_id(id);
  *job.mutable_spec() = spec;
  job.set_state(v1::JOB_STATE_PENDING);
  job.set_created_unix_micros(absl::ToUnixMicros(config_.clock->Now()));
  order_.push_back(id);
  return id;
}

absl::Status JobTable::TransitionLocked(v1::JobManifest& job, v1::JobState to) {
  if (!IsLegal(job.state(), to)) {
    return absl::FailedPreconditionError(absl::StrCat("job ", job.job_id(), " is ",
                                                      JobStateName(job.state()),
                                                      "; it cannot become ", JobStateName(to)));
  }
  job.set_state(to);
  if (IsFinal(to)) job.set_finished_unix_micros(absl::ToUnixMicros(config_.clock->Now()));
  return absl::OkStatus();
}

absl::Status JobTable::Transition(const std::string& job_id, v1::JobState to) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  return TransitionLocked(it->second, to);
}

absl::Status JobTable::Fail(const std::string& job_id, const std::string& host,
                            const std::string& error) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("job ", job_id, " is unknown"));
  if (absl::Status s = TransitionLocked(it->second, v1::JOB_STATE_FAILED); !s.ok()) return s;
  it->second.set_failed_host(host);
  it->second.set_error(error);
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
  return absl::OkStatus();
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
      failed.push_back(id);
    }
  }
  return failed;
}

}  // namespace meshrun::coordinator
