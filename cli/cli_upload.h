// `meshrun submit` sends each program's StableHLO ahead of the job with UploadProgram (in
// chunks, so no request nears the coordinator's --max_request_bytes) and submits the spec with
// the programs named by sha256.
#pragma once

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::services {

// Uploads every program of `spec` that carries bytes, then replaces the bytes with their
// sha256. `timeout` bounds each upload.
// Errors: the coordinator's, prefixed with the program's role; `spec` is unchanged then.
absl::Status UploadPrograms(v1::Coordinator::StubInterface& stub, v1::JobSpec& spec,
                            absl::Duration timeout);

}  // namespace meshrun::services
