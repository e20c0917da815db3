// The coordinator's half of the checkpoint commit protocol (docs/checkpoints.md): it collects
// each host's report for a job's checkpoint step and, once every host of the job reported
// success, commits the step (checkpoint::Commit: manifest written, directory renamed into
// place, older steps beyond keep_last deleted). A step any host failed is discarded. Either
// way the job's manifest records it (JobManifest.checkpoints).
//
// Reports are collected per run (JobManifest.attempts' size): a host that survives a restart
// keeps its incarnation, so only the run number tells its old run's late report from the new
// run's, and an old run's report never completes a new run's commit. Forget drops a job's
// pending reports when the run ends.
//
// Thread-safety: Report and Forget may be called concurrently. Lifetime: borrows the JobTable,
// which must outlive it.
#pragma once

#include <map>
#include <set>
#include <string>
#include <tuple>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/job_table.h"
#include "meshrun/v1/coordinator.pb.h"

namespace meshrun::coordinator {

class CheckpointCommits {
 public:
  explicit CheckpointCommits(JobTable* jobs) : jobs_(jobs) {}

  // One host's report. Commits or discards the step when it is the last host's.
  // Errors: INVALID_ARGUMENT (job_id, host or step missing), NOT_FOUND (unknown job),
  // FAILED_PRECONDITION (the job has no checkpoint policy; the incarnation is not the job's;
  // the report is from an earlier run, named, or the job ended); the commit's file errors (the
  // step is then recorded as failed).
  absl::Status Report(const v1::ReportCheckpointRequest& report);

  // The job's run ended (a restart, a failure, the job's end): drops its pending reports,
  // removes the temp step directories (<step>.meshrun-tmp) of its checkpoints that were never
  // committed, and lists each in the manifest's checkpoints with why (the hosts that did not
  // report). A checkpoint directory belongs to one job at a time (docs/checkpoints.md).
  void Forget(const std::string& job_id);

  // Whether run `attempt` of the job has a step some hosts reported and others not yet, or one
  // being committed: a run must not end before that settles (a preemption's hosts report the
  // step, then their outcome, each on its own time).
  bool Pending(const std::string& job_id, int attempt) const;

  // Steps with reports pending, over all jobs (for tests).
  size_t pending() const;

 private:
  struct Step {
    std::set<std::string> hosts;
    v1::CheckpointManifest manifest;
    std::string error;
    double blocking_seconds = 0;
  };
  absl::Status Finish(const v1::JobManifest& job, Step step);

  JobTable* const jobs_;
  // (job, run, step)
  using Key = std::tuple<std::string, int, int64_t>;
  mutable absl::Mutex mu_;
  std::map<Key, Step> steps_ ABSL_GUARDED_BY(mu_);
  std::map<std::pair<std::string, int>, int> finishing_ ABSL_GUARDED_BY(mu_);  // (job, run)
};

}  // namespace meshrun::coordinator
