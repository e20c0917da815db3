#include "cli/cli_checkpoints.h"

#include <filesystem>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/store.h"

ABSL_FLAG(std::string, checkpoint_dir, "",
          "submit: save the job's state here (shared by every host and the coordinator); "
          "empty = no checkpoints");
ABSL_FLAG(int64_t, checkpoint_every, 100,
          "submit: with --checkpoint_dir, a checkpoint after every N-th step and the last");
ABSL_FLAG(int32_t, memory_checkpoint_every, -1,
          "submit: with --checkpoint_dir, each host also keeps its state in memory after every "
          "N-th step, which a restart restores from when newer than the disk's (0 = never); "
          "-1 = the default (10)");
ABSL_FLAG(int32_t, keep_checkpoints, 3,
          "submit: committed checkpoints kept, newest first (0 = all)");
ABSL_FLAG(std::string, resume_from, "",
          "submit: start from a checkpoint instead of init: a step directory, a checkpoint "
          "directory (its newest step) or a job id (its newest checkpoint)");

ABSL_FLAG(int32_t, max_restarts, -1,
          "submit: automatic restarts from the newest checkpoint after a host dies, fails or "
          "is preempted (0 = none); -1 = the bundle's, else the coordinator's default (3 with "
          "checkpoints)");

namespace meshrun::services {

absl::Status ApplyCheckpointFlags(
    v1::JobSpec& spec,
    const std::function<absl::StatusOr<v1::JobManifest>(const std::string&)>& get_job) {
  namespace fs = std::filesystem;
  const std::string dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (!dir.empty()) {
    if (!fs::is_directory(dir)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--checkpoint_dir ", dir, " is not a directory; create it (on storage every host "
          "of the job mounts)"));
    }
    if (absl::GetFlag(FLAGS_checkpoint_every) < 1) {
      return absl::InvalidArgumentError("--checkpoint_every must be >= 1");
    }
    if (absl::GetFlag(FLAGS_keep_checkpoints) < 0) {
      return absl::InvalidArgumentError("--keep_checkpoints must be >= 0 (0 keeps all)");
    }
    const int32_t memory_every = absl::GetFlag(FLAGS_memory_checkpoint_every);
    if (memory_every < -1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--memory_checkpoint_every is ", memory_every,
          "; it must be >= 0 (0 = never), or -1 for the default"));
    }
    v1::CheckpointPolicy* policy = spec.mutable_checkpoint();
    policy->set_directory(fs::absolute(dir).lexically_normal().string());
    policy->set_every_steps(absl::GetFlag(FLAGS_checkpoint_every));
    policy->set_keep_last(absl::GetFlag(FLAGS_keep_checkpoints));
    if (memory_every >= 0) policy->set_memory_every_steps(memory_every);
  }
  if (const int32_t restarts = absl::GetFlag(FLAGS_max_restarts); restarts >= 0) {
    spec.set_max_restarts(restarts);
  } else if (restarts != -1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_restarts is ", restarts, "; it must be >= 0 (0 = none), or -1 for the default"));
  }
  const std::string resume = absl::GetFlag(FLAGS_resume_from);
  if (resume.empty()) return absl::OkStatus();
  // Each error names the flag: the checkpoint's own errors name only the path.
  auto named = [](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat("--resume_from: ", status.message()));
  };
  if (fs::exists(resume)) {
    absl::StatusOr<std::string> step_dir = checkpoint::ResolveCheckpoint(resume);
    if (!step_dir.ok()) return named(step_dir.status());
    spec.set_resume_from(fs::absolute(*step_dir).lexically_normal().string());
    return absl::OkStatus();
  }
  absl::StatusOr<v1::JobManifest> job = get_job(resume);
  if (!job.ok()) {
    return named(absl::Status(
        job.status().code(),
        absl::StrCat(resume, " is neither a checkpoint directory here nor a job id (",
                     job.status().message(), ")")));
  }
  for (int i = job->checkpoints_size() - 1; i >= 0; --i) {
    const v1::CheckpointRecord& record = job->checkpoints(i);
    if (record.committed() && fs::exists(record.path())) {
      spec.set_resume_from(record.path());
      return absl::OkStatus();
    }
  }
  return named(absl::FailedPreconditionError(
      absl::StrCat("job ", resume, " has no committed checkpoint on this machine")));
}

}  // namespace meshrun::services
