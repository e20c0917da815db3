// The example jobs of examples/ (written by examples/export_examples.py) as C++ values, and a
// small driver that runs one through a Runtime the way the worker will: compile (or load) once,
// init on device, then steps with the state donated and kept on device.
// Used by the oracle test and the runtime benchmark; not part of the worker.
//
// Thread-safety: ExampleRunner is not thread-safe. Lifetime: a runner borrows its Runtime,
// which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/runtime/runtime.h"

namespace meshrun {
class PathRoots;
}  // namespace meshrun

namespace meshrun::runtime {

struct ExampleArray {
  ArraySpec global;                   // name, dtype, global shape
  std::vector<std::string> sharding;  // mesh axis per dimension, "" = not split
  ArrayShape shard;                   // what one device holds
};

struct ExampleProgram {
  std::string code;  // StableHLO portable artifact, format "mlir"
  std::vector<ExampleArray> inputs;
  std::vector<ExampleArray> outputs;
  std::vector<int> donated_inputs;
  ProgramSignature Signature() const;  // per-device shapes
};

struct ExampleJob {
  std::string name;  // "transformer_lm/dp8"
  std::vector<std::string> mesh_axes;
  std::vector<int64_t> mesh_shape;
  std::vector<int64_t> device_ids;  // global ids in mesh (= partition) order
  ExampleProgram init;
  ExampleProgram step;   // compile mode A; empty in mode B
  // Compile mode B (an MoE job): grad(state, grad_acc, micro-batch) -> grad_acc, then
  // apply(state, grad_acc) -> (state, grad_acc zeroed, metrics), after grad_accumulation
  // micro-steps. Empty in mode A.
  ExampleProgram grad;
  ExampleProgram apply;
  int grad_accumulation = 1;
  uint32_t seed = 0;
  std::vector<ExampleArray> data_arrays;         // the step's (mode B: grad's) batch inputs
  // [step][array] global arrays; mode B: [micro-batch][array], grad_accumulation per step
  std::vector<std::vector<HostArray>> batches;
  // Test fixtures, empty when the bundle has none ("reference", "compile_options_jax").
  std::vector<float> reference_loss;             // JAX's loss for each step
  std::vector<float> reference_grad_norm;
  std::string jax_compile_options;               // JAX's serialized options, same partitions
  int num_state = 0;                             // step inputs/outputs [0, num_state) are state
  int loss_output = -1;                          // index of metrics.loss among step (apply) outputs

  bool mode_b() const { return !grad.code.empty(); }
  int OutputIndex(const std::string& name) const;  // among step (mode B: apply) outputs; -1: absent
};

// Reads <dir>/job.json with its programs, data and reference. With `roots` (a worker reading a
// job's bundle), job.json and every file it names must lie under one of them once joined to
// the bundle's directory and resolved ("..", symlinks): client::ReadBundleFile.
// Errors: NOT_FOUND (a file missing, named), INVALID_ARGUMENT (malformed job, the field named;
// a file outside `roots`, naming the field and the roots).
absl::StatusOr<ExampleJob> LoadExampleJob(const std::string& job_json_path,
                                          const PathRoots* roots = nullptr);

// The block of `global` that mesh partition `partition` holds under `sharding`.
// Errors: INVALID_ARGUMENT (unknown axis, dimension not divisible).
absl::StatusOr<HostArray> ShardOf(const HostArray& global, const std::vector<std::string>& sharding,
                                  const std::vector<std::string>& mesh_axes,
                                  const std::vector<int64_t>& mesh_shape, int partition);

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
