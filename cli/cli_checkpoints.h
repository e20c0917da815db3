// The CLI's checkpoint flags (docs/checkpoints.md): --checkpoint_dir, --checkpoint_every,
// --keep_checkpoints, --resume_from and --max_restarts on `meshrun submit`.
#pragma once

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::services {

// Sets spec.checkpoint, spec.max_restarts and spec.resume_from from the flags. --resume_from
// takes a committed step directory, a checkpoint directory (its newest committed step) or a job
// id (`get_job` looks it up; its newest committed checkpoint). Paths become absolute: the
// workers read them.
// Errors, each naming its flag: INVALID_ARGUMENT (a bad value, a directory that does not
// exist), FAILED_PRECONDITION (--resume_from names a partial checkpoint, or a job with none
// committed), get_job's (--resume_from names neither a directory nor a known job).
absl::Status ApplyCheckpointFlags(
    v1::JobSpec& spec,
    const std::function<absl::StatusOr<v1::JobManifest>(const std::string&)>& get_job);

}  // namespace meshrun::services
