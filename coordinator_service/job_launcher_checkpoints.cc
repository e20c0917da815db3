// JobLauncher's checkpoint side (docs/checkpoints.md): `meshrun checkpoint <job>` asks each host
// of a running job to checkpoint after its current step, and automatic recovery restarts a job
// from its newest checkpoint (in its hosts' memory, or committed on disk) when one of its hosts
// dies or fails.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/background_tasks.h"
#include "checkpoint/store.h"
#include "common/status_macros.h"
#include "coordinator/memory_restore.h"
#include "coordinator_service/job_launcher.h"
#include "jobspec/job_validation.h"
#include "rpc/server_support.h"

namespace meshrun::services {
using coordinator::WorkerInfo;

absl::StatusOr<int64_t> JobLauncher::CheckpointNow(const std::string& job_id, bool then_stop) {
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
  // One host: after its current step, whatever that is by the time it is asked.
  if (hosts.size() == 1 && job.host_incarnations_size() == 1) {
    v1::CheckpointNowRequest request;
    request.set_job_id(job_id);
    request.set_then_stop(then_stop);
    v1::CheckpointNowResponse response;
    auto context = ContextWithTimeout(absl::Seconds(5));
    const grpc::Status status =
        WorkerStub(hosts[0])->CheckpointNow(context.get(), request, &response);
    if (!status.ok()) {
      return absl::UnavailableError(absl::StrCat("checkpoint request not delivered to ",
                                                 hosts[0].host, ": ", status.error_message()));
    }
    return 0;
  }
  // Every host must save the same step or the commit never completes, and none can save a
  // step it has passed (the next step took its state). Hosts that exchange data each step are
  // at most one step apart, so two past the furthest, read now, is a step all can still reach.
  // A host that passed it anyway (very short steps) refuses, and the next round aims further.
  constexpr int64_t kMargins[] = {2, 20, 200};
  std::string refused;
  for (const int64_t margin : kMargins) {
    std::vector<int64_t> at(hosts.size(), 0);
    RunConcurrently(hosts.size(), [&](size_t i) {
      v1::GetStatusRequest request;
      v1::WorkerStatusReport status;
      auto context = ContextWithTimeout(absl::Seconds(5));
      if (WorkerStub(hosts[i])->GetStatus(context.get(), request, &status).ok() &&
          status.running_job_id() == job_id) {
        at[i] = status.current_step();
      }
    });
    const int64_t furthest =
        std::max(job.last_step(), hosts.empty() ? 0 : *std::max_element(at.begin(), at.end()));
    const int64_t step = std::min(furthest + margin, job.spec().steps());
    std::vector<grpc::Status> answers(hosts.size());
    RunConcurrently(hosts.size(), [&](size_t i) {
      v1::CheckpointNowRequest request;
      request.set_job_id(job_id);
      request.set_step(step);
      request.set_then_stop(then_stop);
      v1::CheckpointNowResponse response;
      auto context = ContextWithTimeout(absl::Seconds(5));
      answers[i] = WorkerStub(hosts[i])->CheckpointNow(context.get(), request, &response);
    });
    std::vector<std::string> failed;
    bool passed = false;
    for (size_t i = 0; i < hosts.size(); ++i) {
      if (answers[i].ok()) continue;
      failed.push_back(absl::StrCat(hosts[i].host, ": ", answers[i].error_message()));
      passed = passed || answers[i].error_code() == grpc::StatusCode::FAILED_PRECONDITION;
    }
    if (failed.empty()) {
      spdlog::info("job {}: checkpoint of step {} requested on {} hosts{}", job_id, step,
                   hosts.size(), then_stop ? ", then stop (a preemption)" : "");
      return step;
    }
    refused = absl::StrJoin(failed, "; ");
    if (!passed || step == job.spec().steps()) break;
  }
  return absl::UnavailableError(
      absl::StrCat("checkpoint request not taken by every host of job ", job_id, ": ", refused));
}

absl::StatusOr<int64_t> JobLauncher::Preempt(const v1::PreemptJobRequest& request) {
  if (request.job_id().empty() || request.host().empty()) {
    return absl::InvalidArgumentError("job_id and host must be set");
  }
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(request.job_id()));
  RETURN_IF_ERROR(coordinator::CheckJobMember(job, request.host(), request.incarnation()));
  if (request.attempt() != job.attempts_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the preemption is of run ", int64_t{request.attempt()} + 1, " of job ", request.job_id(),
        ", which restarted since (now run ", job.attempts_size() + 1, ")"));
  }
  {
    absl::MutexLock lock(&mu_);
    preempted_[request.job_id()] = {request.attempt(), request.host()};
  }
  absl::StatusOr<int64_t> step = CheckpointNow(request.job_id(), /*then_stop=*/true);
  if (!step.ok() && !absl::IsUnavailable(step.status())) {
    // Refused before any host was asked (no policy, not running): nothing will stop, and a
    // refused notice must leave nothing behind (an ended job's entry would stay forever).
    absl::MutexLock lock(&mu_);
    if (auto it = preempted_.find(request.job_id());
        it != preempted_.end() && it->second == std::pair(request.attempt(), request.host())) {
      preempted_.erase(it);
    }
  }
  return step;
}

void JobLauncher::MarkUnrestorable(const v1::JobManifest& job, const std::string& error) {
  // The reported run's restore path, not the manifest's current one: another host's report of
  // the same failed restore may arrive after the job restarted from an older step.
  absl::Status marked = config_.jobs->Update(job.job_id(), [&](v1::JobManifest& m) {
    for (v1::CheckpointRecord& record : *m.mutable_checkpoints()) {
      if (record.committed() && record.path() == job.spec().resume_from() &&
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
  if (!job.ok() || jobspec::IsFinal(job->state()) || !job->spec().has_checkpoint()) {
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
  const std::vector<coordinator::StepSample> run_steps =
      config_.telemetry != nullptr ? config_.telemetry->step_times().RunSamples(job_id)
                                   : std::vector<coordinator::StepSample>{};
  // A host keeps its state when a peer is lost mid-step, possibly past the last step whose
  // summary was combined: resuming there would leave a hole in the series.
  int64_t at_most = INT64_MAX;
  if (config_.telemetry != nullptr && !job->spec().telemetry().empty()) {
    const int64_t summarized = run_steps.empty() ? job->restored_step() : run_steps.back().step;
    at_most = summarized + std::max(1, job->spec().telemetry_cadence()) - 1;
  }
  const std::optional<v1::MemoryRestore> memory = NewestMemoryCheckpoint(
      *job, host_at_fault ? host : "", newest ? newest->step() : 0, at_most);
  if (newest == nullptr && !memory.has_value()) {
    spdlog::warn("job {}: no committed checkpoint left to restart from", job_id);
    return false;
  }
  const int64_t step = memory.has_value() ? memory->step() : newest->step();
  if (auto member = job->host_incarnations().find(host);
      host_at_fault && member != job->host_incarnations().end()) {
    absl::MutexLock lock(&mu_);
    failed_member_[job_id] = {host, member->second};
  }
  // The run's record keeps the furthest step it reached. Reports raise last_step only when a
  // run ends: a host declared dead before any peer reported would leave it at 0.
  if (config_.telemetry != nullptr) {
    const int64_t reached = config_.telemetry->LatestStep(job_id);  // by any host's summary
    (void)config_.jobs->Update(job_id, [reached](v1::JobManifest& m) {
      m.set_last_step(std::max(m.last_step(), reached));
    });  // a job that ended meanwhile is refused by Restart below
  }
  // Restart first: of two failures of the same run, only one restarts the job.
  const absl::Status restarted = config_.jobs->Restart(
      job_id, host, cause, newest != nullptr ? newest->path() : job->spec().resume_from(), step,
      job->attempts_size(), run_steps, memory.value_or(v1::MemoryRestore()));
  if (absl::IsAborted(restarted)) return true;  // another failure restarted it: handled
  if (!restarted.ok()) return false;            // ended meanwhile
  StopWorkers(*job);  // the old run's hosts, before the new run starts
  commits_.Forget(job_id);  // the old run's uncommitted checkpoints
  spdlog::warn("job {} RESTARTING from its {}checkpoint of step {} (run {} of at most {}): {}",
               job_id, memory.has_value() ? "in-memory " : "", step, job->attempts_size() + 2,
               max_restarts + 1, cause);
  Launch(job_id, job->attempts_size() + 1);
  return true;
}

std::optional<v1::MemoryRestore> JobLauncher::NewestMemoryCheckpoint(const v1::JobManifest& job,
                                                                     const std::string& lost,
                                                                     int64_t at_least,
                                                                     int64_t at_most) {
  if (jobspec::MemoryCheckpointEvery(job.spec().checkpoint()) == 0) return std::nullopt;
  {
    absl::MutexLock lock(&mu_);
    if (auto it = memory_refused_.find(job.job_id()); it != memory_refused_.end()) {
      at_least = std::max(at_least, it->second + 1);
    }
  }
  std::vector<std::string> run_hosts;
  for (const auto& [member, incarnation] : job.host_incarnations()) run_hosts.push_back(member);
  std::vector<WorkerInfo> alive = LiveMembers(job);
  std::erase_if(alive, [&](const WorkerInfo& host) { return host.host == lost; });
  std::vector<coordinator::SurvivingHost> survivors(alive.size());
  RunConcurrently(alive.size(), [&](size_t i) {
    survivors[i].host = alive[i].host;
    survivors[i].address = alive[i].address;
    v1::GetStatusRequest request;
    v1::WorkerStatusReport status;
    auto context = ContextWithTimeout(absl::Seconds(1));
    if (WorkerStub(alive[i], kProbeReconnectWait)->GetStatus(context.get(), request, &status)
            .ok() &&
        status.incarnation() == alive[i].incarnation) {
      survivors[i].held.assign(status.memory_checkpoints().begin(),
                               status.memory_checkpoints().end());
    }
  });
  std::optional<v1::MemoryRestore> picked = coordinator::PickMemoryRestore(
      job.job_id(), run_hosts, survivors, job.mesh().replica_hosts_size() > 1, at_least, at_most);
  if (!picked.has_value()) {  // the restart reads the disk tier: say why
    spdlog::info("job {}: no in-memory checkpoint at or past step {}{} covers the run's {} hosts "
                 "({} survive); restoring from disk",
                 job.job_id(), at_least,
                 at_most == INT64_MAX ? "" : absl::StrCat(" and through ", at_most),
                 run_hosts.size(), alive.size());
  }
  return picked;
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
