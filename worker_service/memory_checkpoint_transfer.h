// Moving an in-memory checkpoint between workers (docs/checkpoints.md, "Memory tier"): a host
// that takes a lost host's place in a restarted job fetches the state blocks from a host of the
// ended run that holds them (Worker.FetchMemoryCheckpoint), instead of reading the older
// committed checkpoint from disk.
//
// Thread-safety: the reactor is gRPC's (one call); FetchMemoryCheckpoint may be called from any
// thread. Errors: as each function states.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "meshrun/v1/job.pb.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "worker/memory_checkpoints.h"

namespace meshrun::services {

// Largest piece of a block one message carries.
inline constexpr int64_t kMemoryPieceBytes = 1 << 20;

// Serves `snapshot` (null: NOT_FOUND naming the job and step) as pieces; the reactor deletes
// itself when the call ends and keeps the snapshot alive until then.
grpc::ServerWriteReactor<v1::MemoryCheckpointPiece>* ServeMemoryCheckpoint(
    std::shared_ptr<const worker::MemorySnapshot> snapshot, const v1::FetchMemoryCheckpointRequest& request);

// Fetches step `step` of `job_id` from the first of `holders` that serves it (its worker
// channel checks the holder's identity), skipping `self`. Errors: UNAVAILABLE naming each
// holder tried and why (none held it, none answered), INVALID_ARGUMENT (a malformed piece).
absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> FetchMemoryCheckpoint(
    const v1::MemoryRestore& restore, const std::string& job_id, const std::string& self,
    absl::Duration timeout);

}  // namespace meshrun::services
