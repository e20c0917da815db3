// Which in-memory checkpoint a restarted job restores (docs/checkpoints.md, "Memory tier"): from
// what the surviving hosts of the ended run hold, the newest step that still covers every mesh
// position, and the hosts that hold it.
//
// Host replicas hold the same state on every host, so any survivor's copy covers a lost
// replica's place. Hosts of one SPMD program hold different shards, and each keeps a copy of
// its ring predecessor's: a step counts when a survivor holds every host's blocks, its own or
// that copy (so losing one host loses nothing; two neighbours, the disk tier).
//
// Thread-safety: a pure function.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "meshrun/v1/job.pb.h"
#include "meshrun/v1/worker.pb.h"

namespace meshrun::coordinator {

// A host of the ended run that is still alive (same incarnation), with what it holds.
struct SurvivingHost {
  std::string host;
  std::string address;
  std::vector<v1::MemoryCheckpointHeld> held;  // any job's: only `job_id`'s count
};

// The newest step of `job_id` in [at_least, at_most] that the survivors cover for a run on
// `run_hosts` (host replicas when `replicas`); nullopt when none does.
std::optional<v1::MemoryRestore> PickMemoryRestore(const std::string& job_id,
                                                   const std::vector<std::string>& run_hosts,
                                                   const std::vector<SurvivingHost>& survivors,
                                                   bool replicas, int64_t at_least,
                                                   int64_t at_most = INT64_MAX);

}  // namespace meshrun::coordinator
