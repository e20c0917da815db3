// A job bundle (job.json with its programs, batches and reference, as meshrun.export and
// examples/export_examples.py write it) as typed C++ values: the worker loads a job's bundle
// through LoadExampleJob, and tests and benches load the examples of examples/ the same way
// (testing/example_runner.h runs one).
//
// Thread-safety: plain values and a pure function; safe from any thread.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/types.h"

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

}  // namespace meshrun::runtime
