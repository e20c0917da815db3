#include "coordinator/checkpoint_commits.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/store.h"
#include "common/status_macros.h"

namespace meshrun::coordinator {

absl::Status CheckpointCommits::Report(const v1::ReportCheckpointRequest& report) {
  if (report.job_id().empty() || report.host().empty() || report.step() < 1) {
    return absl::InvalidArgumentError("job_id, host and step (>= 1) must be set");
  }
  ASSIGN_OR_RETURN(v1::JobManifest job, jobs_->Get(report.job_id()));
  if (!job.spec().has_checkpoint()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", report.job_id(), " has no checkpoint policy"));
  }
  if (jobspec::IsFinal(job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", report.job_id(), " already ended ", jobspec::JobStateName(job.state()),
        "; its checkpoint of step ", report.step(), " is not committed"));
  }
  // A host that survived a restart keeps its incarnation: the run number tells its old run's
  // late report from the new run's.
  if (report.attempt() != job.attempts_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint of step ", report.step(), " is from run ", int64_t{report.attempt()} + 1,
        " of job ", report.job_id(), ", which restarted since (now run ",
        job.attempts_size() + 1, "); it is not committed"));
  }
  RETURN_IF_ERROR(CheckJobMember(job, report.host(), report.incarnation()));
  const Key key{report.job_id(), report.attempt(), report.step()};
  Step done;
  {
    absl::MutexLock lock(&mu_);
    Step& step = steps_[key];
    step.hosts.insert(report.host());
    v1::CheckpointManifest& manifest = step.manifest;
    manifest.set_job_id(report.job_id());
    manifest.set_step(report.step());
    if (report.error().empty()) {
      manifest.add_hosts(report.host());
      manifest.set_data_position(report.data_position());
    } else if (step.error.empty()) {
      step.error = report.error();
    }
    step.blocking_seconds = std::max(step.blocking_seconds, report.blocking_seconds());
    // An array's chunks may come from several hosts: merge them by name.
    for (const v1::CheckpointArray& array : report.arrays()) {
      v1::CheckpointArray* merged = nullptr;
      for (v1::CheckpointArray& a : *manifest.mutable_arrays()) {
        if (a.name() == array.name()) merged = &a;
      }
      if (merged == nullptr) {
        merged = manifest.add_arrays();
        *merged = array;
        merged->clear_chunks();
      }
      for (const v1::CheckpointChunk& chunk : array.chunks()) *merged->add_chunks() = chunk;
    }
    if (step.hosts.size() < static_cast<size_t>(job.host_incarnations_size())) {
      return absl::OkStatus();
    }
    done = std::move(step);
    steps_.erase(key);
    ++finishing_[{report.job_id(), report.attempt()}];  // still Pending until it is recorded
  }
  struct Finished {
    CheckpointCommits* self;
    std::pair<std::string, int> run;
    ~Finished() {
      absl::MutexLock lock(&self->mu_);
      if (--self->finishing_[run] == 0) self->finishing_.erase(run);
    }
  } finished{this, {report.job_id(), report.attempt()}};
  // The run may have ended while the reports came in (Forget then ran before this step was
  // complete): its checkpoint is not the job's any more.
  ASSIGN_OR_RETURN(job, jobs_->Get(report.job_id()));
  if (jobspec::IsFinal(job.state()) || job.attempts_size() != report.attempt()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "run ", int64_t{report.attempt()} + 1, " of job ", report.job_id(),
        " ended before its checkpoint of step ", report.step(), " was complete"));
  }
  return Finish(job, std::move(done));
}

void CheckpointCommits::Forget(const std::string& job_id) {
  std::map<int64_t, Step> dropped;  // by step: reported by some hosts, not all
  {
    absl::MutexLock lock(&mu_);
    auto it = steps_.lower_bound(Key{job_id, std::numeric_limits<int>::min(),
                                     std::numeric_limits<int64_t>::min()});
    while (it != steps_.end() && std::get<0>(it->first) == job_id) {
      dropped[std::get<2>(it->first)] = std::move(it->second);
      it = steps_.erase(it);
    }
  }
  absl::StatusOr<v1::JobManifest> job = jobs_->Get(job_id);
  if (!job.ok() || !job->spec().has_checkpoint()) return;
  const std::vector<int64_t> discarded =
      checkpoint::DiscardAllTemp(job->spec().checkpoint().directory());
  if (!discarded.empty()) {
    spdlog::info("job {}: discarded {} uncommitted checkpoint(s) of its run, the newest of step {}",
                 job_id, discarded.size(), discarded.back());
  }
  // Each checkpoint the run began and did not commit is listed with why (docs/checkpoints.md).
  std::vector<v1::CheckpointRecord> records;
  for (auto& [step, pending] : dropped) {
    std::vector<std::string> missing;
    for (const auto& [host, incarnation] : job->host_incarnations()) {
      if (!pending.hosts.contains(host)) missing.push_back(host);
    }
    std::sort(missing.begin(), missing.end());
    v1::CheckpointRecord& record = records.emplace_back();
    record.set_step(step);
    record.set_error(absl::StrCat("not committed: the run ended before every host reported it (",
                                  "no report from ", absl::StrJoin(missing, ", "), ")"));
  }
  for (int64_t step : discarded) {
    if (dropped.contains(step)) continue;
    v1::CheckpointRecord& record = records.emplace_back();
    record.set_step(step);
    record.set_error("not committed: the run ended while its hosts were writing it");
  }
  if (records.empty()) return;
  const int64_t now = absl::ToUnixMicros(absl::Now());
  absl::Status recorded = jobs_->Update(job_id, [&](v1::JobManifest& manifest) {
    for (v1::CheckpointRecord& record : records) {
      record.set_unix_micros(now);
      *manifest.add_checkpoints() = record;
    }
  });
  if (!recorded.ok()) spdlog::warn("job {}: checkpoint records: {}", job_id, recorded.ToString());
}

bool CheckpointCommits::Pending(const std::string& job_id, int attempt) const {
  absl::MutexLock lock(&mu_);
  if (finishing_.contains({job_id, attempt})) return true;
  auto it = steps_.lower_bound(Key{job_id, attempt, std::numeric_limits<int64_t>::min()});
  return it != steps_.end() && std::get<0>(it->first) == job_id &&
         std::get<1>(it->first) == attempt;
}

size_t CheckpointCommits::pending() const {
  absl::MutexLock lock(&mu_);
  return steps_.size();
}

absl::Status CheckpointCommits::Finish(const v1::JobManifest& job, Step step) {
  const v1::CheckpointPolicy& policy = job.spec().checkpoint();
  v1::CheckpointRecord record;
  record.set_step(step.manifest.step());
  record.set_blocking_seconds(step.blocking_seconds);
  absl::Status status = absl::OkStatus();
  if (step.error.empty()) {
    for (const std::string& axis : job.mesh().axis_names()) step.manifest.add_mesh_axes(axis);
    for (int64_t n : job.mesh().shape()) step.manifest.add_mesh_shape(n);
    step.manifest.set_committed_unix_micros(absl::ToUnixMicros(absl::Now()));
    absl::StatusOr<std::string> dir =
        checkpoint::Commit(policy.directory(), step.manifest, policy.keep_last());
    status = dir.status();
    if (dir.ok()) {
      record.set_committed(true);
      record.set_path(*dir);
      spdlog::info("job {}: checkpoint of step {} committed at {}", job.job_id(),
                   step.manifest.step(), *dir);
    } else {
      step.error = absl::StrCat("commit: ", status.message());
    }
  }
  if (!step.error.empty()) {
    checkpoint::Discard(policy.directory(), step.manifest.step());
    record.set_error(step.error);
    spdlog::error("job {}: checkpoint of step {} failed: {}", job.job_id(), step.manifest.step(),
                  step.error);
  }
  record.set_unix_micros(absl::ToUnixMicros(absl::Now()));
  RETURN_IF_ERROR(jobs_->Update(job.job_id(), [&record](v1::JobManifest& manifest) {
    *manifest.add_checkpoints() = record;
  }));
  return status;
}

}  // namespace meshrun::coordinator
