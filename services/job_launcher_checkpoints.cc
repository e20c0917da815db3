// JobLauncher's checkpoint requests (docs/checkpoints.md): `meshrun checkpoint <job>` asks each
// host of a running job to checkpoint after its current step.
#include <spdlog/spdlog.h>

#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/background_tasks.h"
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

}  // namespace meshrun::services
