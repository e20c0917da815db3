// The worker service's checkpoint glue (docs/checkpoints.md): from a job's manifest, the
// CheckpointSaver that writes this host's shards and reports them to the coordinator, the
// in-memory checkpoints, and the resume from memory or `spec.resume_from` (the state read from the checkpoint, the batch source moved
// to where the checkpoint's run left it, the loop starting after the checkpoint's step).
//
// Thread-safety: call from one thread (StartJob). Lifetime: the returned saver borrows the
// runtime, metrics and coordinator stub, which must outlive it.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "meshrun/v1/job.pb.h"
#include "worker/checkpointing.h"
#include "worker/memory_checkpoints.h"
#include "worker/step_loop.h"

namespace meshrun::services {

struct JobCheckpointContext {
  const v1::JobManifest* manifest = nullptr;
  const v1::Program* state_program = nullptr;  // takes the state as inputs [0, state_count)
  std::string host;
  std::string incarnation;
  bool writes = true;  // false: a host replica other than replica 0 (it holds a copy)
  runtime::Runtime* runtime = nullptr;
  worker::Metrics* metrics = nullptr;
  v1::Coordinator::Stub* coordinator = nullptr;
  worker::MemoryCheckpointStore* memory = nullptr;  // this worker's in-memory checkpoints
  // Where this host's ring predecessor serves (StartJobRequest.ring_peer_address): it keeps a
  // copy of that host's in-memory checkpoints. Empty: no ring (the program is on one host).
  std::string ring_peer_address;
};

// Fills `loop`'s checkpoint hooks (disk, and memory into context.memory) and, for a resumed or
// restarted job, its restore_state and spec.first_step, and skips `loop.batches` ahead: from
// the manifest's memory_restore when set (the copies this host holds, else the blocks it
// needs fetched from a holder), else from spec.resume_from. Returns the saver (null without a
// checkpoint policy), which must outlive the loop.
// Errors: FAILED_PRECONDITION (resume_from not a committed checkpoint), the batch source's.
absl::StatusOr<std::shared_ptr<worker::CheckpointSaver>> ConfigureCheckpoints(
    const JobCheckpointContext& context, worker::StepLoop::Config& loop);

}  // namespace meshrun::services
