// Array-batch data (DataSource.array_file, docs/data.md) as a job sees it: which inputs the
// file fills, how many bytes one batch takes, and the file's data receipt at submit.
// Pure functions over the spec and the file; thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "meshrun/v1/job.pb.h"
#include "worker/array_file.h"

namespace meshrun::jobspec {

// The inputs an array file fills, in order: the step's (mode B: grad's) inputs after the
// state (mode B: and the gradient accumulator), before any sparse plan tables.
// Errors: INVALID_ARGUMENT (no step/grad program, or it takes no batch input).
absl::StatusOr<std::vector<v1::TensorSpec>> ArrayBatchInputs(const v1::JobSpec& spec);

// One batch of the file as the program takes it: each batch input with its global shape, the
// first dimension times the host replicas (mesh.host_replicas > 1: the file holds the global
// batch, host h takes its h-th block of rows).
// Errors: ArrayBatchInputs', INVALID_ARGUMENT (an unknown dtype, named).
absl::StatusOr<std::vector<worker::BatchArray>> ArrayFileBatch(const v1::JobSpec& spec);

// Checks spec.data.array_file against the job's batch inputs (worker::ArrayFile::Open) and
// returns its receipt (the file, its bytes and sha256; unchecked_layout for a file without a
// header). Errors: INVALID_ARGUMENT: ArrayFile::Open's, prefixed "spec.data.array_file: ";
// ArrayFileBatch's.
absl::StatusOr<v1::DataReceipt> ArrayFileReceipt(const v1::JobSpec& spec);

}  // namespace meshrun::jobspec
