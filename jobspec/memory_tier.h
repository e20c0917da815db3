// What a job's in-memory checkpoints (docs/checkpoints.md, "Memory tier") take on each host,
// shared by the coordinator (which checks it fits at placement and which copies cover a lost
// host) and the worker (which keeps them and copies its ring predecessor's).
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::jobspec {

// Steps of a job each host keeps in memory: a restart picks one every host still holds, and
// hosts may be one checkpoint apart when a run ends.
inline constexpr int kMemoryCheckpointsKept = 2;

// The mesh partitions (indices in mesh order) `host` runs: all of them for a host replica or a
// one-host mesh, else those whose device is on `host`. Also on the part of a mesh one host's
// StartJob carries (MeshAssignment.partitions), which names that host and its ring predecessor.
std::vector<int64_t> PartitionsOf(const v1::MeshAssignment& mesh, const std::string& host);

// The hosts one SPMD program spans, in mesh order (empty for host replicas and one-host meshes,
// where every host holds the whole state). Each keeps a copy of its ring predecessor's blocks.
std::vector<std::string> RingHosts(const v1::MeshAssignment& mesh);
// `host`'s ring predecessor; empty when the program does not span hosts. On the mesh a host's
// StartJob carries, which holds just the two of them, the other one.
std::string RingPredecessor(const v1::MeshAssignment& mesh, const std::string& host);

// Bytes `host` keeps for `spec`'s in-memory checkpoints on `mesh`: kMemoryCheckpointsKept steps
// of the distinct state blocks on its partitions, and of its ring predecessor's. 0 when the job
// takes none. Errors: INVALID_ARGUMENT (a state dtype or sharding the mesh cannot give).
absl::StatusOr<int64_t> MemoryTierHostBytes(const v1::JobSpec& spec,
                                            const v1::MeshAssignment& mesh,
                                            const std::string& host);

// Refuses a job whose in-memory checkpoints need more than the `available` bytes `host`
// offers (0: unknown, not checked). Errors: RESOURCE_EXHAUSTED naming the host, both figures,
// the field and the fixes.
absl::Status CheckMemoryTierFits(const v1::JobSpec& spec, const v1::MeshAssignment& mesh,
                                 const std::string& host, int64_t available);

}  // namespace meshrun::jobspec
