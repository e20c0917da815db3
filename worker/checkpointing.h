// The worker's side of checkpoints (docs/checkpoints.md): saving the state shards this host
// owns from the step loop's checkpoint hook, and making the state from a checkpoint on resume.
//
// Saving. At a checkpoint step the hook copies to host only the chunks this host writes (each
// distinct shard once, by the host of the lowest mesh partition that holds it; of host replicas,
// replica 0 alone), then hands them to the saver's writer thread and returns: that copy is all
// the step loop waits for (CheckpointBlockingTime). The writer thread writes and fsyncs the
// chunks into the step's temp directory and reports to the coordinator through `report`, with
// the chunks' sha256 or the error; a failed checkpoint never fails the job. A checkpoint due
// while the previous one is still being written waits for it (one in flight at a time, so host
// memory holds at most one copy of the state).
//
// Thread-safety: the hook runs on the loop thread; Flush() and the destructor may be called
// from any thread. Lifetime: borrows the Runtime and Metrics, which must outlive the saver; the
// destructor flushes (waits for the write in flight).
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "checkpoint/store.h"
#include "meshrun/v1/coordinator.pb.h"
#include "meshrun/v1/job.pb.h"
#include "worker/metrics.h"
#include "runtime/runtime.h"
#include "worker/step_loop.h"

namespace meshrun::worker {

class CheckpointSaver {
 public:
  using Report = std::function<void(v1::ReportCheckpointRequest)>;
  struct Config {
    runtime::Runtime* runtime = nullptr;
    std::string job_id;
    std::string host;
    std::string incarnation;
    std::string directory;               // the job's checkpoint directory
    std::vector<v1::TensorSpec> state;   // the state inputs [0, state_count), global shapes
    std::vector<std::string> mesh_axes;
    std::vector<int64_t> mesh_shape;
    bool writes = true;                  // false: a host replica other than replica 0
    Report report;                       // called on the writer thread, once per checkpoint
    Metrics* metrics = nullptr;
  };
  // Errors: INVALID_ARGUMENT (no runtime, directory or report; a state dtype zarr cannot name).
  static absl::StatusOr<std::unique_ptr<CheckpointSaver>> Create(Config config);
  ~CheckpointSaver();

  // The step loop's hook (StepLoop::Config::checkpoint); valid while the saver lives.
  StepLoop::CheckpointHook Hook();
  // Waits until the checkpoint being written (if any) was written and reported.
  void Flush();

 private:
  struct Pending {
    int64_t step = 0;
    int64_t data_position = 0;
    double blocking_seconds = 0;
    std::vector<checkpoint::ArrayChunks> arrays;
    absl::Status copy_error;  // the copy to host failed: nothing to write, report it
  };
  explicit CheckpointSaver(Config config) : config_(std::move(config)) {}
  void Save(int64_t step, const StepLoop::DeviceBuffers& state,
            const std::vector<int64_t>& partitions, int64_t data_position);
  void WriterMain();
  bool HasWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return pending_.has_value() || stop_; }
  bool Idle() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return !pending_.has_value() && !writing_; }

  Config config_;
  absl::Mutex mu_;
  std::optional<Pending> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread writer_;
};

// The state [device][state input] for `device_indices` running mesh `partitions`, read from the
// committed checkpoint at `step_dir` (each array read whole, its chunks checked against their
// sha256, then cut to each device's block of this job's sharding: another mesh works).
// Errors: DATA_LOSS (a chunk missing or corrupted, named), FAILED_PRECONDITION (an array the
// job's state needs is missing or differs in dtype or shape, named), the runtime's transfer
// errors.
absl::StatusOr<StepLoop::DeviceBuffers> RestoreState(
    runtime::Runtime& runtime, const std::string& step_dir,
    const std::vector<v1::TensorSpec>& state, const std::vector<std::string>& mesh_axes,
    const std::vector<int64_t>& mesh_shape, const std::vector<int>& device_indices,
    const std::vector<int64_t>& partitions, Metrics* metrics);

}  // namespace meshrun::worker
