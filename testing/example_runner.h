// A small driver that runs an example job (bundle/example_job.h) through a Runtime the way the
// worker does: compile (or load) once, init on device, then steps with the state donated and
// kept on device. Used by the oracle tests and the benches; not part of any product.
//
// Thread-safety: ExampleRunner is not thread-safe. Lifetime: a runner borrows its Runtime,
// which must outlive it.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "bundle/example_job.h"
#include "runtime/runtime.h"

namespace meshrun::runtime {

class ExampleRunner {
 public:
  // Compiles init and step with meshrun's own compile options for the job's device assignment;
  // with `load_step_serialized` the step is compiled, serialized and run from
  // DeserializeAndLoad instead (as a worker receives it).
  // Errors: INVALID_ARGUMENT for a mode B job; the runtime's (compile, load); INTERNAL when a
  // partition lands off its device.
  static absl::StatusOr<std::unique_ptr<ExampleRunner>> Create(Runtime* runtime, ExampleJob job,
                                                               bool load_step_serialized = false);

  // Runs init (state on device) and uploads every batch shard. Call before Step.
  // Errors: the runtime's (transfers, execution).
  absl::Status Initialize();
  // One training step on batch `index % batches`, pipelined as the worker's loop does: the step
  // is launched on the state the previous step is still computing, then the previous step is
  // waited for, so at most two are in flight and the devices never wait for the host. With
  // `read` the named outputs (replicated telemetry) are copied to the host from the first
  // device, which waits for this step too; otherwise nothing is.
  // Errors: FAILED_PRECONDITION before Initialize; the runtime's (the previous step's
  // execution failure is reported by the call that waits for it).
  absl::StatusOr<std::vector<HostArray>> Step(int index, const std::vector<int>& read = {});
  // Waits for the step in flight, if any (a timed loop ends with it, as JAX's
  // block_until_ready). Errors: that step's execution failure.
  absl::Status Finish();

  const ExampleJob& job() const { return job_; }
  const Executable& step_executable() const { return *step_; }
  absl::Duration step_compile_time() const { return step_compile_time_; }

 private:
  ExampleRunner(Runtime* runtime, ExampleJob job) : runtime_(runtime), job_(std::move(job)) {}

  Runtime* runtime_;
  ExampleJob job_;
  std::unique_ptr<Executable> init_;
  std::unique_ptr<Executable> step_;
  absl::Duration step_compile_time_;
  // [device][input]: state buffers, replaced by each step's outputs.
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> state_;
  // The last launched step, until waited for: its completion and its other outputs.
  std::unique_ptr<ExecutionEvent> in_flight_;
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> in_flight_outputs_;
  // [batch][device][array]
  std::vector<std::vector<std::vector<std::unique_ptr<DeviceBuffer>>>> batches_;
};

}  // namespace meshrun::runtime
