// In-memory checkpoints (docs/checkpoints.md, "Memory tier"): every few steps a host copies the
// blocks of the state its devices hold into host memory, so a restart can restore from there
// (or from another host holding the same blocks) instead of the newest committed checkpoint on
// disk, which is older.
//
// A snapshot holds each distinct block of each state input once (blocks several local devices
// share are copied once), keyed like a checkpoint's chunks (checkpoint/layout.h ChunkKey), so
// it restores onto the same mesh: any host whose devices run the same mesh partitions.
//
// Thread-safety: MemoryCheckpointStore is safe from any thread; snapshots are immutable once
// stored (shared_ptr<const>). The free functions borrow the runtime for the call.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "meshrun/v1/job.pb.h"
#include "runtime/runtime.h"
#include "worker/metrics.h"
#include "worker/step_loop.h"

namespace meshrun::worker {

struct MemorySnapshot {
  std::string job_id;
  int64_t step = 0;
  int64_t data_position = 0;  // batches consumed through `step`
  // state input name -> chunk key -> the block's bytes
  std::map<std::string, std::map<std::string, runtime::HostArray>> blocks;

  int64_t Bytes() const;
};

// The newest snapshots of one job (the job this host ran last): a restart picks a step every
// host of the ended run holds, and hosts may be one snapshot apart when a run ends.
class MemoryCheckpointStore {
 public:
  static constexpr int kKeptPerJob = 2;

  // Keeps `snapshot` with the newest kKeptPerJob - 1 of its job's older steps; drops every
  // other job's, and its job's steps at or past it (a restarted run's, which ended).
  void Put(std::shared_ptr<const MemorySnapshot> snapshot);
  // Null when not held.
  std::shared_ptr<const MemorySnapshot> Get(const std::string& job_id, int64_t step) const;
  // Every snapshot held, newest first.
  std::vector<std::shared_ptr<const MemorySnapshot>> Held() const;
  void Drop(const std::string& job_id);
  int64_t Bytes() const;

 private:
  mutable absl::Mutex mu_;
  std::vector<std::shared_ptr<const MemorySnapshot>> snapshots_ ABSL_GUARDED_BY(mu_);
};

// The state layout a snapshot is taken and restored with.
struct StateLayout {
  std::vector<v1::TensorSpec> state;  // the state inputs, global shapes and shardings
  std::vector<std::string> mesh_axes;
  std::vector<int64_t> mesh_shape;
};

// Copies the blocks of `state` (per local device, mesh partitions `partitions`) to host.
// Errors: INVALID_ARGUMENT (a sharding the mesh cannot give), the runtime's transfer errors.
absl::StatusOr<std::shared_ptr<MemorySnapshot>> TakeSnapshot(
    runtime::Runtime& runtime, const StateLayout& layout, const std::string& job_id,
    int64_t step, int64_t data_position, const StepLoop::DeviceBuffers& state,
    const std::vector<int64_t>& partitions, Metrics* metrics);

// The state [device][state input] for `device_indices` running mesh `partitions`, from
// `snapshot`. Errors: FAILED_PRECONDITION (a block the snapshot does not hold, or of another
// shape: it was taken on another mesh), the runtime's transfer errors.
absl::StatusOr<StepLoop::DeviceBuffers> RestoreSnapshot(runtime::Runtime& runtime,
                                                        const StateLayout& layout,
                                                        const MemorySnapshot& snapshot,
                                                        const std::vector<int>& device_indices,
                                                        const std::vector<int64_t>& partitions,
                                                        Metrics* metrics);

}  // namespace meshrun::worker
