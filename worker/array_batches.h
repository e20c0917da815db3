// The step loop's feed from an array-batch file (array_file.h): any model's batch inputs, not
// only tokens. Each Next() is the next record (cycling), one global array per batch input; a
// host replica (docs/multihost_cpu.md) takes its block of rows of each. Copies only that
// record's bytes out of the mapping. Thread-safety: one thread at a time (BatchSource).
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/array_file.h"
#include "runtime/types.h"
#include "worker/step_loop.h"

namespace meshrun::worker {

struct ArrayBatchSpec {
  // The program's batch inputs in order (one host replica's shapes).
  std::vector<runtime::ArrayShape> arrays;
  int replica_index = 0;
  int replica_count = 1;  // the file holds replica_count x each array's rows
};

// Errors: INVALID_ARGUMENT when the file's records are not the spec's size (named), or
// replica_index is outside [0, replica_count).
absl::StatusOr<std::unique_ptr<BatchSource>> MakeArrayFileBatches(
    std::shared_ptr<const ArrayFile> file, ArrayBatchSpec spec);

}  // namespace meshrun::worker
