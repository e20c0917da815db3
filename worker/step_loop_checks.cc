// StepLoop::Create's checks of its config (declared in step_loop_internal.h).
#include <algorithm>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "worker/step_loop_internal.h"

namespace meshrun::worker {

using runtime::DType;

absl::Status CheckConfigComplete(const StepLoop::Config& config, bool mode_b) {
  if (config.runtime == nullptr) return absl::InvalidArgumentError("no runtime given");
  if (mode_b) {
    if (config.init == nullptr || config.grad == nullptr || config.apply == nullptr ||
        config.step != nullptr) {
      return absl::InvalidArgumentError(
          "compile mode B needs the init, grad and apply executables, and no step executable");
    }
  } else if (config.init == nullptr || config.step == nullptr) {
    return absl::InvalidArgumentError("the init and step executables are required");
  }
  if (config.batches == nullptr) return absl::InvalidArgumentError("no batch source given");
  if (config.clock == nullptr) return absl::InvalidArgumentError("no clock given");
  return absl::OkStatus();
}

absl::Status CheckStepRange(const RunSpec& spec) {
  if (spec.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("steps must be >= 1, got ", spec.steps));
  }
  if (spec.replica_count < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica_count must be >= 1, got ", spec.replica_count));
  }
  if (spec.first_step < 1 || spec.first_step > spec.steps + 1) {
    return absl::InvalidArgumentError(absl::StrCat("first_step must be in [1, steps + 1 = ",
                                                   spec.steps + 1, "], got ", spec.first_step));
  }
  return absl::OkStatus();
}

absl::Status CheckPrograms(const StepLoop::Config& config, bool mode_b) {
  const RunSpec& spec = config.spec;
  const runtime::Executable& init = *config.init;
  const runtime::Executable& step = mode_b ? *config.apply : *config.step;
  if (mode_b) {
    if (spec.grad_accumulation < 1 || spec.num_grad_acc < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "compile mode B needs grad_accumulation >= 1 and num_grad_acc >= 1, got ",
          spec.grad_accumulation, " and ", spec.num_grad_acc));
    }
    const auto& grad_out = config.grad->output_shapes();
    const auto& apply_out = config.apply->output_shapes();
    if (grad_out.size() < static_cast<size_t>(spec.num_grad_acc) ||
        apply_out.size() < static_cast<size_t>(spec.num_state + spec.num_grad_acc)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grad returns ", grad_out.size(), " and apply ", apply_out.size(), " arrays; with ",
          spec.num_state, " state and ", spec.num_grad_acc,
          " accumulator arrays grad must return the accumulators and apply state + accumulators"));
    }
    for (int i = 0; i < spec.num_grad_acc; ++i) {
      if (grad_out[i] != apply_out[spec.num_state + i]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "accumulator ", i, " is ", runtime::ToString(grad_out[i]), " out of grad but ",
            runtime::ToString(apply_out[spec.num_state + i]), " out of apply"));
      }
    }
    if (config.grad->device_indices() != step.device_indices()) {
      return absl::InvalidArgumentError("the grad and apply programs run on different devices");
    }
  }
  if (spec.num_state < 0 || static_cast<size_t>(spec.num_state) != init.output_shapes().size()) {
    return absl::InvalidArgumentError(absl::StrCat("num_state is ", spec.num_state,
                                                   ", the init program returns ",
                                                   init.output_shapes().size(), " arrays"));
  }
  if (static_cast<size_t>(spec.num_state) > step.output_shapes().size()) {
    return absl::InvalidArgumentError(absl::StrCat("num_state is ", spec.num_state,
                                                   ", the step program returns only ",
                                                   step.output_shapes().size(), " arrays"));
  }
  if (init.device_indices() != step.device_indices() || step.device_indices().empty()) {
    return absl::InvalidArgumentError("the init and step programs run on different devices");
  }
  // The init program's seed.
  if (init.signature().has_value()) {
    const auto& inputs = init.signature()->inputs;
    if (inputs.size() > 1 || (inputs.size() == 1 && !inputs[0].shape.dims.empty())) {
      return absl::InvalidArgumentError("the init program must take one scalar seed (or nothing)");
    }
    if (inputs.size() == 1) {
      const DType t = inputs[0].shape.dtype;
      if (t != DType::kU32 && t != DType::kS32 && t != DType::kU64 && t != DType::kS64) {
        return absl::InvalidArgumentError(
            absl::StrCat("the init program's seed is ", runtime::ToString(inputs[0].shape),
                         "; expected u32, s32, u64 or s64"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int64_t>> PartitionsOf(
    const RunSpec& spec, const std::vector<int>& devices,
    const std::vector<runtime::DeviceDescription>& addressable) {
  if (spec.mesh_axes.size() != spec.mesh_shape.size()) {
    return absl::InvalidArgumentError(absl::StrCat("mesh axes (", spec.mesh_axes.size(),
                                                   ") and mesh shape (", spec.mesh_shape.size(),
                                                   ") differ in length"));
  }
  int64_t mesh_size = 1;
  for (int64_t n : spec.mesh_shape) {
    if (n < 1) return absl::InvalidArgumentError("mesh dimensions must be >= 1");
    mesh_size *= n;
  }
  std::vector<int64_t> partitions;
  if (spec.device_ids.empty()) {
    if (mesh_size != static_cast<int64_t>(devices.size())) {
      return absl::InvalidArgumentError(absl::StrCat("the mesh has ", mesh_size,
                                                     " partitions, the step program runs on ",
                                                     devices.size(), " devices"));
    }
    for (size_t p = 0; p < devices.size(); ++p) partitions.push_back(static_cast<int64_t>(p));
  } else {
    const bool some = !spec.device_partitions.empty();
    if (some && spec.device_partitions.size() != spec.device_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_ids names ", spec.device_ids.size(), " devices but device_partitions ",
          spec.device_partitions.size()));
    }
    if (!some && mesh_size != static_cast<int64_t>(spec.device_ids.size())) {
      return absl::InvalidArgumentError(absl::StrCat("the mesh has ", mesh_size,
                                                     " partitions, device_ids names ",
                                                     spec.device_ids.size()));
    }
    for (int d : devices) {
      const auto it = std::find(spec.device_ids.begin(), spec.device_ids.end(),
                                addressable[d].global_id);
      if (it == spec.device_ids.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "device ", addressable[d].runtime_name, " (global id ", addressable[d].global_id,
            ") runs the step but is not in the job's device_ids"));
      }
      const int64_t index = it - spec.device_ids.begin();
      const int64_t partition = some ? spec.device_partitions[index] : index;
      if (partition < 0 || partition >= mesh_size) {
        return absl::InvalidArgumentError(absl::StrCat("device ", addressable[d].runtime_name,
                                                       " is given partition ", partition,
                                                       " of a mesh of ", mesh_size));
      }
      partitions.push_back(partition);
    }
  }
  return partitions;
}

absl::Status CheckBatchInputs(const RunSpec& spec, const runtime::Executable& batch_program,
                              int batch_offset, bool mode_b) {
  for (const auto& sharding : spec.batch_sharding) {
    for (const std::string& axis : sharding) {
      if (!axis.empty() &&
          std::find(spec.mesh_axes.begin(), spec.mesh_axes.end(), axis) == spec.mesh_axes.end()) {
        return absl::InvalidArgumentError(absl::StrCat("batch sharding names unknown mesh axis '",
                                                       axis, "'"));
      }
    }
  }
  if (const auto& batch_signature = batch_program.signature();
      batch_signature.has_value() &&
      batch_signature->inputs.size() != batch_offset + spec.batch_sharding.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the ", mode_b ? "grad" : "step", " program takes ", batch_signature->inputs.size(),
        " inputs: ", spec.num_state, " state",
        mode_b ? absl::StrCat(", ", spec.num_grad_acc, " accumulator") : "", " and ",
        spec.batch_sharding.size(), " batch inputs were declared"));
  }
  return absl::OkStatus();
}

absl::StatusOr<TelemetryOutputs> TelemetryOutputsOf(const RunSpec& spec,
                                                    const runtime::Executable& step) {
  const std::optional<runtime::ProgramSignature>& signature = step.signature();
  TelemetryOutputs outputs;
  std::set<std::string> names;
  for (const TelemetryOutput& t : spec.telemetry) {
    if (!signature.has_value()) {
      return absl::InvalidArgumentError(
          "telemetry outputs are declared but the step executable has no signature to name them");
    }
    if (!names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat("telemetry output '", t.name,
                                                     "' is declared twice"));
    }
    const std::string& output = t.output.empty() ? t.name : t.output;
    int index = -1;
    for (size_t i = 0; i < signature->outputs.size(); ++i) {
      if (signature->outputs[i].name == output) index = static_cast<int>(i);
    }
    if (index < 0 || static_cast<size_t>(index) >= step.output_shapes().size()) {
      std::vector<std::string> outputs;
      for (const auto& o : signature->outputs) outputs.push_back(o.name);
      return absl::InvalidArgumentError(absl::StrCat("telemetry output '", output,
                                                     "' is not an output of the step; it returns ",
                                                     absl::StrJoin(outputs, ", ")));
    }
    outputs.index.push_back(index);
    outputs.series.push_back({t.name, step.output_shapes()[index], t.combine, t.threshold, t.sharding});
  }

  return outputs;
}

}  // namespace meshrun::worker
