// The worker's feed for a job whose data is an array-batch file (DataSource.array_file,
// docs/data.md): the file memory-mapped, checked against the job's data receipt, and read one
// batch at a time into the step's batch inputs. Thread-safety: as worker::BatchSource.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "meshrun/v1/job.pb.h"
#include "worker/step_loop.h"

namespace meshrun::services {

// `replica_index`: this host's place among the job's host replicas (0 on one host).
// Errors: FAILED_PRECONDITION (the file's sha256 is not the receipt's: it differs between hosts
// or changed since submit), INVALID_ARGUMENT / NOT_FOUND (jobspec/array_data.h, ArrayFile).
absl::StatusOr<std::unique_ptr<worker::BatchSource>> ArrayFileBatchesFor(
    const v1::JobManifest& manifest, int replica_index);

}  // namespace meshrun::services
