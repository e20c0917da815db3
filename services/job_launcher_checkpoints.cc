// JobLauncher's checkpoint side (docs/checkpoints.md): `meshrun checkpoint <job>` asks each host
// of a running job to checkpoint after its current step, and automatic recovery restarts a job
// from its newest committed checkpoint when one of its hosts dies or fails.
#include <spdlog/spdlog.h>

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/background_tasks.h"
#include "checkpoint/store.h"
#include "common/status_macros.h"
#include "services/job_launcher.h"
#include "services/server_support.h"

namespace meshrun::services {

absl::Status JobLauncher::CheckpointNow(const std::string& job_id) {
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(job_id));
  if (!job.spec().has_checkpoint()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " has no checkpoint policy; submit it with --checkpoint_dir"));
  }
  if (job.state() != v1::JOB_STATE_RUNNING) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " is ", v1::JobState_Name(job.state()), ", not RUNNING"));
  }
  std::vector<coordinator::WorkerInfo> hosts;
  for (const coordinator::WorkerEntry& entry : config_.registry->List()) {
    auto it = job.host_incarnations().find(entry.info.host);
    if (it != job.host_incarnations().end() && it->second == entry.info.incarnation) {
      hosts.push_back(entry.info);
    }
  }
  std::vector<std::string> failures(hosts.size());
  RunConcurrently(hosts.size(), [&](size_t i) {
    v1::CheckpointNowRequest request;
    request.set_job_id(job_id);
    v1::CheckpointNowResponse response;
    auto context = ContextWithTimeout(absl::Seconds(5));
    grpc::Status status = WorkerStub(hosts[i].address).CheckpointNow(context.get(), request,
                                                                     &response);
    if (!status.ok()) failures[i] = absl::StrCat(hosts[i].host, ": ", status.error_message());
  });
  std::vector<std::string> failed;
  for (const std::string& f : failures) {
    if (!f.empty()) failed.push_back(f);
  }
  if (!failed.empty()) {
    return absl::UnavailableError(absl::StrCat("checkpoint request not delivered to ",
                                               absl::StrJoin(failed, "; ")));
  }
  spdlog::info("job {}: checkpoint requested on {} hosts", job_id, hosts.size());
  return absl::OkStatus();
}

void JobLauncher::MarkUnrestorable(const v1::JobManifest& job, const std::string& error) {
  absl::Status marked = config_.jobs->Update(job.job_id(), [&](v1::JobManifest& m) {
    for (v1::CheckpointRecord& record : *m.mutable_checkpoints()) {
      if (record.committed() && record.path() == m.spec().resume_from() &&
          record.restore_error().empty()) {
        record.set_restore_error(error);
        spdlog::error("job {}: its checkpoint of step {} cannot be restored: {}", m.job_id(),
                      record.step(), error);
      }
    }
  });
  if (!marked.ok()) spdlog::warn("job {}: {}", job.job_id(), marked.ToString());
}

bool JobLauncher::MaybeRestart(const std::string& job_id, const std::string& host,
                               const std::string& cause, bool host_at_fault) {
  absl::StatusOr<v1::JobManifest> job = config_.jobs->Get(job_id);
  if (!job.ok() || coordinator::IsFinal(job->state()) || !job->spec().has_checkpoint()) {
    return false;
  }
  const int max_restarts =
      job->spec().has_max_restarts() ? job->spec().max_restarts() : kDefaultMaxRestarts;
  if (job->attempts_size() >= max_restarts) {
    if (max_restarts > 0) {
      spdlog::warn("job {}: no restart left ({} of {} used)", job_id, job->attempts_size(),
                   max_restarts);
    }
    return false;
  }
  const v1::CheckpointRecord* newest = nullptr;
  for (const v1::CheckpointRecord& record : job->checkpoints()) {
    // Retention may have deleted an older record's directory since.
    if (record.committed() && record.restore_error().empty() &&
        (newest == nullptr || record.step() >= newest->step()) &&
        std::filesystem::exists(std::filesystem::path(record.path()) / checkpoint::kManifestFile)) {
      newest = &record;
    }
  }
  if (newest == nullptr) {
    spdlog::warn("job {}: no committed checkpoint left to restart from", job_id);
    return false;
  }
  if (auto member = job->host_incarnations().find(host);
      host_at_fault && member != job->host_incarnations().end()) {
    absl::MutexLock lock(&mu_);
    failed_member_[job_id] = {host, member->second};
  }
  // Restart first: of two failures of the same run, only one restarts the job.
  const absl::Status restarted = config_.jobs->Restart(job_id, host, cause, newest->path(),
                                                       newest->step(), job->attempts_size());
  if (absl::IsAborted(restarted)) return true;  // another failure restarted it: handled
  if (!restarted.ok()) return false;            // ended meanwhile
  StopWorkers(*job);  // the old run's hosts, before the new run starts
  commits_.Forget(job_id);  // the old run's uncommitted checkpoints
  spdlog::warn("job {} RESTARTING from its checkpoint of step {} (run {} of at most {}): {}",
               job_id, newest->step(), job->attempts_size() + 2, max_restarts + 1, cause);
  Launch(job_id, job->attempts_size() + 1);
  return true;
}

void JobLauncher::GiveUpRestart(const v1::JobManifest& job, const absl::Status& why) {
  const v1::JobAttempt& ended = job.attempts(job.attempts_size() - 1);
  const std::string error = absl::StrCat(
      "no healthy hosts to restart on within --restart_wait=",
      absl::FormatDuration(config_.restart_wait), " (", why.message(), "); run ",
      job.attempts_size(), " had ended: ", ended.cause(), "; resume from its checkpoint of step ",
      ended.restored_step(), " with --resume_from=", job.job_id());
  Fail(job.job_id(), ended.host(), error, /*host_at_fault=*/true, /*may_restart=*/false)
      .IgnoreError();  // cancelled meanwhile
}

}  // namespace meshrun::services
