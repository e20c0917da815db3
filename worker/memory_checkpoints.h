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
#include <utility>
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
  // Empty: this host's own blocks. Else the ring peer whose copy this is (a program spanning
  // hosts: each keeps its predecessor's, jobspec/memory_tier.h).
  std::string of_host;
  // state input name -> chunk key -> the block's bytes
  std::map<std::string, std::map<std::string, runtime::HostArray>> blocks;

  int64_t Bytes() const;
};

// The newest snapshots of one job (the job this host ran last), its own and its ring peer's:
// a restart picks a step every host of the ended run holds, and hosts may be one snapshot
// apart when a run ends.
class MemoryCheckpointStore {
 public:
  // jobspec::kMemoryCheckpointsKept, which the coordinator sizes host memory with.
  static constexpr int kKeptPerJob = 2;

  // Keeps `snapshot` with the newest kKeptPerJob - 1 older steps of its job of the same kind
  // (own, or a peer's copy); drops every other job's, and its job's steps of that kind at or
  // past it (a restarted run's, which ended).
  void Put(std::shared_ptr<const MemorySnapshot> snapshot);
  // This host's own snapshot of the step; null when not held.
  std::shared_ptr<const MemorySnapshot> Get(const std::string& job_id, int64_t step) const;
  // Every snapshot of the step held, its own first.
  std::vector<std::shared_ptr<const MemorySnapshot>> Copies(const std::string& job_id,
                                                            int64_t step) const;
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

// The blocks (state input name, chunk key) a host running mesh `partitions` needs.
// Errors: INVALID_ARGUMENT (a sharding the mesh cannot give).
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> BlocksNeeded(
    const StateLayout& layout, const std::vector<int64_t>& partitions);

// The state [device][state input] for `device_indices` running mesh `partitions`, from the
// first of `copies` holding each block. Errors: FAILED_PRECONDITION (a block none holds, or of
// another shape: taken on another mesh), the runtime's transfer errors.
absl::StatusOr<StepLoop::DeviceBuffers> RestoreSnapshot(
    runtime::Runtime& runtime, const StateLayout& layout,
    const std::vector<std::shared_ptr<const MemorySnapshot>>& copies,
    const std::vector<int>& device_indices, const std::vector<int64_t>& partitions,
    Metrics* metrics);

}  // namespace meshrun::worker
