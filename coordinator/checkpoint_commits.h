// The coordinator's half of the checkpoint commit protocol (docs/checkpoints.md): it collects
// each host's report for a job's checkpoint step and, once every host of the job reported
// success, commits the step (checkpoint::Commit: manifest written, directory renamed into
// place, older steps beyond keep_last deleted). A step any host failed is discarded. Either
// way the job's manifest records it (JobManifest.checkpoints).
//
// Thread-safety: Report may be called concurrently. Lifetime: borrows the JobTable, which must
// outlive it.
#pragma once

#include <map>
#include <set>
#include <string>
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
  // FAILED_PRECONDITION (the job has no checkpoint policy; the incarnation is not the job's);
  // the commit's file errors (the step is then recorded as failed).
  absl::Status Report(const v1::ReportCheckpointRequest& report);

 private:
  struct Step {
    std::set<std::string> hosts;
    v1::CheckpointManifest manifest;
    std::string error;
    double blocking_seconds = 0;
  };
  absl::Status Finish(const v1::JobManifest& job, Step step);

  JobTable* const jobs_;
  absl::Mutex mu_;
  std::map<std::pair<std::string, int64_t>, Step> steps_ ABSL_GUARDED_BY(mu_);  // (job, step)
};

}  // namespace meshrun::coordinator
