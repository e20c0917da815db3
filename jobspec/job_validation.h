// Checks a submitted JobSpec before anything is scheduled, so a bad job is refused at submit
// with the field named and no worker is touched. Thread-safe (no shared state).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/path_roots.h"
#include "meshrun/v1/job.pb.h"
#include "worker/sparse/mask_contract.h"
#include "worker/sparse/plan_tables.h"

namespace meshrun::jobspec {

// Errors: INVALID_ARGUMENT naming the field (e.g. "spec.telemetry[1].name \"los\" is not an
// output of the step program") and, where there is one, the fix.
absl::Status ValidateJobSpec(const v1::JobSpec& spec);

// The data receipt of the job's data source: for token shards, reads and validates every file
// the glob matches (worker/token_shards.h); synthetic=true for synthetic data; empty for an
// examples/ bundle. Call after ValidateJobSpec.
// Errors: INVALID_ARGUMENT naming spec.data.token_shards_glob and the file (no match, a corrupt
// or unreadable file, too few tokens for one batch.tokens row).
absl::StatusOr<v1::DataReceipt> ReadDataReceipt(const v1::JobSpec& spec,
                                               const PathRoots* roots = nullptr);

// How often a job with `policy` takes in-memory checkpoints (docs/checkpoints.md, "Memory
// tier"): memory_every_steps, 10 when unset; 0 = never.
inline constexpr int kDefaultMemoryCheckpointEvery = 10;
inline int64_t MemoryCheckpointEvery(const v1::CheckpointPolicy& policy) {
  return policy.has_memory_every_steps() ? policy.memory_every_steps()
                                         : kDefaultMemoryCheckpointEvery;
}

// The step of the checkpoint spec.resume_from holds; 0 without one. Errors: as
// checkpoint::ReadManifest, prefixed "spec.resume_from: ".
absl::StatusOr<int64_t> RestoredStep(const v1::JobSpec& spec);

// The mask contract of a job's sparse_attention (unchecked; ValidateJobSpec checks it).
worker::sparse::MaskContract SparseContractOf(const v1::SparseAttention& sparse);

// The (table, step input name) pairs sparse_attention names, in PlanTable order.
std::vector<std::pair<worker::sparse::PlanTable, std::string>> SparseTableInputs(
    const v1::SparseAttention& sparse);

// Compile mode B (grad + apply programs) for MoE models, for a job whose programs are grad +
// apply (meshrun.export with grad=/apply=), and for any model run as host
// replicas (mesh.host_replicas > 1: the hosts average gradients between grad and apply);
// otherwise A (one whole-step program), as for dense and Mamba-only models.
bool IsModeB(const v1::JobSpec& spec);
// "A" or "B", as IsModeB.
const char* CompileMode(const v1::JobSpec& spec);

}  // namespace meshrun::jobspec
