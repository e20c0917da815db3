#include "worker/step_loop.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/runtime/compile_options.h"
#include "worker/runtime/example_job.h"

namespace meshrun::worker {
namespace {

using runtime::ArrayShape;
using runtime::DeviceBuffer;
using runtime::DType;
using runtime::HostArray;
using telemetry::Combine;

// ---- the reduction program, written as StableHLO text ----

absl::StatusOr<std::string> MlirElementType(DType dtype) {
  switch (dtype) {
    case DType::kPred: return std::string("i1");
    case DType::kS8: return std::string("i8");
    case DType::kS16: return std::string("i16");
    case DType::kS32: return std::string("i32");
    case DType::kS64: return std::string("i64");
    case DType::kU8: return std::string("ui8");
    case DType::kU16: return std::string("ui16");
    case DType::kU32: return std::string("ui32");
    case DType::kU64: return std::string("ui64");
    case DType::kF16: return std::string("f16");
    case DType::kBF16: return std::string("bf16");
    case DType::kF32: return std::string("f32");
    case DType::kF64: return std::string("f64");
    case DType::kInvalid: break;
  }
  return absl::InvalidArgumentError("telemetry output has an invalid dtype");
}

std::string TensorType(const std::vector<int64_t>& dims, absl::string_view element) {
  if (dims.empty()) return absl::StrCat("tensor<", element, ">");
  return absl::StrCat("tensor<", absl::StrJoin(dims, "x"), "x", element, ">");
}

// An f32 literal MLIR parses exactly, whatever its value (NaN and infinities included).
std::string F32Literal(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return absl::StrFormat("0x%08X", bits);
}

// Row-major mesh coordinate of partition p.
std::vector<int64_t> MeshCoord(int64_t partition, const std::vector<int64_t>& mesh_shape) {
  std::vector<int64_t> coord(mesh_shape.size());
  for (int a = static_cast<int>(mesh_shape.size()) - 1; a >= 0; --a) {
    coord[a] = partition % mesh_shape[a];
    partition /= mesh_shape[a];
  }
  return coord;
}

// Writes SSA values "%v<n>".
class Writer {
 public:
  std::string Op(absl::string_view rhs) {
    std::string name = absl::StrCat("%v", next_++);
    absl::StrAppend(&body_, "    ", name, " = ", rhs, "\n");
    return name;
  }
  std::string& body() { return body_; }

 private:
  int next_ = 0;
  std::string body_;
};

absl::Status PrefixStatus(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

}  // namespace

std::string LoopOutcomeName(LoopOutcome outcome) {
  switch (outcome) {
    case LoopOutcome::kSucceeded: return "SUCCEEDED";
    case LoopOutcome::kFailed: return "FAILED";
    case LoopOutcome::kCancelled: return "CANCELLED";
  }
  return "?";
}

// ---- TelemetryReducer ----

absl::Status BatchSource::Skip(int64_t consumed) {
  for (int64_t i = 0; i < consumed; ++i) RETURN_IF_ERROR(Next().status());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TelemetryReducer>> TelemetryReducer::Create(Config config) {
  if (config.runtime == nullptr) return absl::InvalidArgumentError("no runtime given");
  if (config.series.empty()) return absl::InvalidArgumentError("no telemetry series to reduce");
  const size_t num_devices = config.device_indices.size();
  if (num_devices == 0 || config.partitions.size() != num_devices) {
    return absl::InvalidArgumentError(absl::StrCat("telemetry reducer: ", num_devices,
                                                   " devices but ", config.partitions.size(),
                                                   " partitions"));
  }
  if (config.mesh_axes.size() != config.mesh_shape.size()) {
    return absl::InvalidArgumentError("mesh axes and mesh shape differ in length");
  }
  const auto& addressable = config.runtime->addressable_devices();
  for (int d : config.device_indices) {
    if (d < 0 || static_cast<size_t>(d) >= addressable.size()) {
      return absl::InvalidArgumentError(absl::StrCat("device index ", d, " is not addressable"));
    }
  }

  // Per series: the positions (into device_indices) whose shards it combines.
  std::vector<std::vector<int>> representatives;
  bool collective = false;
  for (const Series& s : config.series) {
    if (s.shape.NumElements() <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("telemetry output '", s.name, "' (",
                                                     runtime::ToString(s.shape),
                                                     ") has no elements"));
    }
    RETURN_IF_ERROR(MlirElementType(s.shape.dtype).status());
    if (s.threshold.has_value() && std::isnan(*s.threshold)) {
      return absl::InvalidArgumentError(
          absl::StrCat("telemetry output '", s.name, "' has a NaN threshold"));
    }
    if (s.sharding.size() > s.shape.dims.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "telemetry output '", s.name, "': sharding names ", s.sharding.size(),
          " dimensions, the output ", runtime::ToString(s.shape), " has ", s.shape.dims.size()));
    }
    std::vector<int> axes;  // mesh axes the output is split over
    for (const std::string& axis : s.sharding) {
      if (axis.empty()) continue;
      size_t a = 0;
      while (a < config.mesh_axes.size() && config.mesh_axes[a] != axis) ++a;
      if (a == config.mesh_axes.size()) {
        return absl::InvalidArgumentError(absl::StrCat("telemetry output '", s.name,
                                                       "' is sharded over unknown mesh axis '",
                                                       axis, "'; the mesh has ",
                                                       absl::StrJoin(config.mesh_axes, ", ")));
      }
      axes.push_back(static_cast<int>(a));
    }
    std::vector<int> reps;
    std::set<std::vector<int64_t>> seen;
    for (size_t p = 0; p < num_devices; ++p) {
      const std::vector<int64_t> coord = MeshCoord(config.partitions[p], config.mesh_shape);
      std::vector<int64_t> key;
      for (int a : axes) key.push_back(coord[a]);
      if (seen.insert(key).second) reps.push_back(static_cast<int>(p));
    }
    if (reps.size() > 1) collective = true;
    representatives.push_back(std::move(reps));
  }

  auto reducer = std::unique_ptr<TelemetryReducer>(new TelemetryReducer(std::move(config)));
  const Config& c = reducer->config_;
  // One replica per local device when some series needs a collective; else device 0 alone.
  const int replicas = collective ? static_cast<int>(num_devices) : 1;

  Writer w;
  std::vector<std::string> params, pieces, flags;
  for (size_t i = 0; i < c.series.size(); ++i) {
    const Series& s = c.series[i];
    ASSIGN_OR_RETURN(std::string element, MlirElementType(s.shape.dtype));
    const std::string type = TensorType(s.shape.dims, element);
    const int64_t n = s.shape.NumElements();
    const std::string row = TensorType({1, n}, "f32");
    params.push_back(absl::StrCat("%a", i, ": ", type));
    std::string x = absl::StrCat("%a", i);
    if (s.shape.dtype != DType::kF32) {
      x = w.Op(absl::StrCat("stablehlo.convert ", x, " : (", type, ") -> ",
                            TensorType(s.shape.dims, "f32")));
    }
    x = w.Op(absl::StrCat("stablehlo.reshape ", x, " : (", TensorType(s.shape.dims, "f32"),
                          ") -> ", row));
    const std::vector<int>& reps = representatives[i];
    std::string value = x;
    if (reps.size() > 1) {
      std::vector<int> group(replicas);
      for (int r = 0; r < replicas; ++r) group[r] = r;
      const std::string gathered_type = TensorType({replicas, n}, "f32");
      const std::string gathered = w.Op(absl::StrCat(
          "\"stablehlo.all_gather\"(", x, ") {all_gather_dim = 0 : i64, replica_groups = dense<[[",
          absl::StrJoin(group, ", "), "]]> : tensor<1x", replicas, "xi64>} : (", row, ") -> ",
          gathered_type));
      std::vector<std::string> parts;
      for (int r : reps) {
        parts.push_back(w.Op(absl::StrCat(
            "\"stablehlo.slice\"(", gathered, ") {start_indices = array<i64: ", r,
            ", 0>, limit_indices = array<i64: ", r + 1, ", ", n,
            ">, strides = array<i64: 1, 1>} : (", gathered_type, ") -> ", row)));
      }
      if (s.combine == Combine::kLast) {
        // The representative with the highest mesh partition.
        size_t last = 0;
        for (size_t k = 1; k < reps.size(); ++k) {
          if (c.partitions[reps[k]] > c.partitions[reps[last]]) last = k;
        }
        value = parts[last];
      } else {
        const char* op = s.combine == Combine::kMax   ? "stablehlo.maximum"
                         : s.combine == Combine::kMin ? "stablehlo.minimum"
                                                      : "stablehlo.add";
        value = parts[0];
        for (size_t k = 1; k < parts.size(); ++k) {
          value = w.Op(absl::StrCat(op, " ", value, ", ", parts[k], " : ", row));
        }
        if (s.combine == Combine::kMean) {
          const std::string count = w.Op(absl::StrCat(
              "stablehlo.constant dense<", F32Literal(static_cast<float>(reps.size())), "> : ",
              row));
          value = w.Op(absl::StrCat("stablehlo.divide ", value, ", ", count, " : ", row));
        }
      }
    }
    const std::string flat_type = TensorType({n}, "f32");
    const std::string flat =
        w.Op(absl::StrCat("stablehlo.reshape ", value, " : (", row, ") -> ", flat_type));
    pieces.push_back(flat);
    if (s.threshold.has_value()) {
      const std::string bound = w.Op(absl::StrCat(
          "stablehlo.constant dense<", F32Literal(static_cast<float>(*s.threshold)), "> : ",
          flat_type));
      const std::string within = w.Op(absl::StrCat("stablehlo.compare LE, ", flat, ", ", bound,
                                                   ", FLOAT : (", flat_type, ", ", flat_type,
                                                   ") -> ", TensorType({n}, "i1")));
      const std::string outside =
          w.Op(absl::StrCat("stablehlo.not ", within, " : ", TensorType({n}, "i1")));
      const std::string no = w.Op("stablehlo.constant dense<false> : tensor<i1>");
      const std::string any = w.Op(absl::StrCat(
          "stablehlo.reduce(", outside, " init: ", no,
          ") applies stablehlo.or across dimensions = [0] : (", TensorType({n}, "i1"),
          ", tensor<i1>) -> tensor<i1>"));
      const std::string as_float =
          w.Op(absl::StrCat("stablehlo.convert ", any, " : (tensor<i1>) -> tensor<f32>"));
      flags.push_back(
          w.Op(absl::StrCat("stablehlo.reshape ", as_float, " : (tensor<f32>) -> tensor<1xf32>")));
    }
    reducer->output_elements_ += n;
  }
  reducer->output_elements_ += static_cast<int64_t>(flags.size());
  const std::string out_type = TensorType({reducer->output_elements_}, "f32");
  std::vector<std::string> all = pieces, types;
  all.insert(all.end(), flags.begin(), flags.end());
  for (const Series& s : c.series) types.push_back(TensorType({s.shape.NumElements()}, "f32"));
  types.resize(all.size(), "tensor<1xf32>");
  std::string result = all[0];
  if (all.size() > 1) {
    result = w.Op(absl::StrCat("stablehlo.concatenate ", absl::StrJoin(all, ", "),
                               ", dim = 0 : (", absl::StrJoin(types, ", "), ") -> ", out_type));
  }
  reducer->program_ = absl::StrCat(
      "module @meshrun_telemetry attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = ",
      replicas, " : i32} {\n  func.func public @main(", absl::StrJoin(params, ", "), ") -> ",
      out_type, " {\n", w.body(), "    return ", result, " : ", out_type, "\n  }\n}\n");

  // Replica r runs on device_indices[r].
  runtime::CompileOptionsSpec options;
  options.num_replicas = replicas;
  options.num_partitions = 1;
  options.use_spmd_partitioning = false;
  options.use_shardy_partitioner = false;
  for (int r = 0; r < replicas; ++r) {
    options.device_assignment.push_back({addressable[c.device_indices[r]].global_id});
  }
  ASSIGN_OR_RETURN(std::string options_bytes, runtime::BuildCompileOptions(options));
  runtime::ProgramSignature signature;
  for (const Series& s : c.series) signature.inputs.push_back({s.name, s.shape});
  signature.outputs.push_back({"telemetry", {DType::kF32, {reducer->output_elements_}}});
  const absl::Time start = c.clock->Now();
  absl::StatusOr<std::unique_ptr<runtime::Executable>> executable =
      c.runtime->Compile({reducer->program_, "mlir", options_bytes, signature});
  if (!executable.ok()) {
    return PrefixStatus(executable.status(), "telemetry reduction program: ");
  }
  reducer->executable_ = *std::move(executable);
  if (c.metrics != nullptr) c.metrics->AddTime(kCompileTime, c.clock->Now() - start);
  // Map the executable's device order back to positions.
  for (int device : reducer->executable_->device_indices()) {
    int position = -1;
    for (int r = 0; r < replicas; ++r) {
      if (c.device_indices[r] == device) position = r;
    }
    if (position < 0) {
      return absl::InternalError(absl::StrCat("telemetry reduction program runs on device ",
                                              device, ", which is not one of the step's"));
    }
    reducer->positions_.push_back(position);
  }
  if (reducer->positions_.size() != static_cast<size_t>(replicas)) {
    return absl::InternalError(absl::StrCat("telemetry reduction program runs on ",
                                            reducer->positions_.size(), " devices, expected ",
                                            replicas));
  }
  return reducer;
}

absl::StatusOr<std::vector<TelemetryValue>> TelemetryReducer::Reduce(
    absl::Span<const std::vector<DeviceBuffer*>> per_device) {
  const Config& c = config_;
  if (per_device.size() != c.device_indices.size()) {
    return absl::InvalidArgumentError(absl::StrCat("telemetry reduce: ", per_device.size(),
                                                   " device lists, expected ",
                                                   c.device_indices.size()));
  }
  std::vector<std::vector<DeviceBuffer*>> args;
  size_t read_from = 0;
  for (size_t k = 0; k < positions_.size(); ++k) {
    const std::vector<DeviceBuffer*>& buffers = per_device[positions_[k]];
    if (buffers.size() != c.series.size()) {
      return absl::InvalidArgumentError(absl::StrCat("telemetry reduce: ", buffers.size(),
                                                     " buffers, expected ", c.series.size()));
    }
    args.push_back(buffers);
    if (positions_[k] == 0) read_from = k;
  }
  absl::Time start = c.clock->Now();
  ASSIGN_OR_RETURN(auto outputs, c.runtime->Execute(*executable_, args, {}));
  absl::Time now = c.clock->Now();
  if (c.metrics != nullptr) c.metrics->AddTime(kExecuteTime, now - start);
  start = now;
  ASSIGN_OR_RETURN(HostArray vector, c.runtime->ToHost(*outputs[read_from][0]));
  if (c.metrics != nullptr) {
    c.metrics->AddTime(kTransferFromDeviceTime, c.clock->Now() - start);
    c.metrics->AddBytes(kTransferFromDeviceBytes, static_cast<int64_t>(vector.bytes.size()));
  }
  const std::vector<float> flat = vector.As<float>();
  if (static_cast<int64_t>(flat.size()) != output_elements_) {
    return absl::InternalError(absl::StrCat("telemetry vector has ", flat.size(),
                                            " elements, expected ", output_elements_));
  }
  std::vector<TelemetryValue> values;
  size_t offset = 0;
  for (const Series& s : c.series) {
    const size_t n = static_cast<size_t>(s.shape.NumElements());
    values.push_back({s.name, s.shape.dims,
                      std::vector<float>(flat.begin() + offset, flat.begin() + offset + n)});
    offset += n;
  }
  for (size_t i = 0; i < c.series.size(); ++i) {
    if (c.series[i].threshold.has_value()) values[i].threshold_exceeded = flat[offset++] != 0.0f;
  }
  return values;
}

// ---- StepLoop ----

absl::StatusOr<std::unique_ptr<StepLoop>> StepLoop::Create(Config config) {
  if (config.runtime == nullptr) return absl::InvalidArgumentError("no runtime given");
  const bool mode_b = config.grad != nullptr || config.apply != nullptr;
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
  const RunSpec& spec = config.spec;
  ASSIGN_OR_RETURN(telemetry::Cadence cadence, telemetry::Cadence::Create(spec.telemetry_cadence));
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
  const runtime::Executable& init = *config.init;
  // The program that ends a step (state and telemetry out), and the one that takes the batches.
  const runtime::Executable& step = mode_b ? *config.apply : *config.step;
  const runtime::Executable& batch_program = mode_b ? *config.grad : *config.step;
  const int batch_offset = spec.num_state + (mode_b ? spec.num_grad_acc : 0);
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
  // Mesh and partitions.
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
  const std::vector<int>& devices = step.device_indices();
  const auto& addressable = config.runtime->addressable_devices();
  std::vector<int64_t> partitions;
  if (spec.device_ids.empty()) {
    if (mesh_size != static_cast<int64_t>(devices.size())) {
      return absl::InvalidArgumentError(absl::StrCat("the mesh has ", mesh_size,
                                                     " partitions, the step program runs on ",
                                                     devices.size(), " devices"));
    }
    for (size_t p = 0; p < devices.size(); ++p) partitions.push_back(static_cast<int64_t>(p));
  } else {
    if (mesh_size != static_cast<int64_t>(spec.device_ids.size())) {
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
      partitions.push_back(it - spec.device_ids.begin());
    }
  }
  // Batch inputs.
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
  const std::optional<runtime::ProgramSignature>& signature = step.signature();
  // Telemetry outputs.
  std::vector<int> telemetry_index;
  std::vector<TelemetryReducer::Series> series;
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
    int index = -1;
    for (size_t i = 0; i < signature->outputs.size(); ++i) {
      if (signature->outputs[i].name == t.name) index = static_cast<int>(i);
    }
    if (index < 0 || static_cast<size_t>(index) >= step.output_shapes().size()) {
      std::vector<std::string> outputs;
      for (const auto& o : signature->outputs) outputs.push_back(o.name);
      return absl::InvalidArgumentError(absl::StrCat("telemetry output '", t.name,
                                                     "' is not an output of the step; it returns ",
                                                     absl::StrJoin(outputs, ", ")));
    }
    telemetry_index.push_back(index);
    series.push_back({t.name, step.output_shapes()[index], t.combine, t.threshold, t.sharding});
  }

  auto loop = std::unique_ptr<StepLoop>(new StepLoop(std::move(config), cadence));
  loop->devices_ = devices;
  loop->partitions_ = partitions;
  loop->telemetry_index_ = std::move(telemetry_index);
  const RunSpec& run = loop->config_.spec;
  const int num_acc = mode_b ? run.num_grad_acc : 0;
  for (int i = 0; i < run.num_state + num_acc; ++i) loop->donate_.push_back(i);
  for (int i = 0; i < num_acc; ++i) loop->grad_donate_.push_back(run.num_state + i);
  loop->batch_program_ = &batch_program;
  loop->batch_offset_ = batch_offset;
  if (!series.empty()) {
    ASSIGN_OR_RETURN(loop->reducer_,
                     TelemetryReducer::Create({.runtime = loop->config_.runtime,
                                               .device_indices = devices,
                                               .partitions = partitions,
                                               .mesh_axes = loop->config_.spec.mesh_axes,
                                               .mesh_shape = loop->config_.spec.mesh_shape,
                                               .series = std::move(series),
                                               .metrics = loop->metrics_,
                                               .clock = loop->config_.clock}));
  }
  return loop;
}

StepLoop::StepLoop(Config config, telemetry::Cadence cadence)
    : config_(std::move(config)),
      metrics_(config_.metrics != nullptr ? config_.metrics : &own_metrics_),
      cadence_(cadence) {}

StepLoop::~StepLoop() { Stop(); }

absl::Status StepLoop::Start() {
  {
    absl::MutexLock l(&mu_);
    if (started_) return absl::FailedPreconditionError("the step loop was already started");
    started_ = true;
    last_completed_ = config_.spec.first_step - 1;
  }
  absl::MutexLock join(&join_mu_);
  prefetch_thread_ = std::thread([this] { PrefetchMain(); });
  thread_ = std::thread([this] { Run(); });
  return absl::OkStatus();
}

void StepLoop::Cancel() {
  absl::MutexLock l(&mu_);
  cancel_ = true;
}

void StepLoop::Stop() {
  {
    absl::MutexLock l(&mu_);
    cancel_ = true;
    if (std::this_thread::get_id() == loop_thread_id_) return;  // from a callback: cancel only
  }
  absl::MutexLock join(&join_mu_);
  if (thread_.joinable()) thread_.join();
}

bool StepLoop::ResultReady() const { return result_.has_value(); }

LoopResult StepLoop::Wait() {
  absl::MutexLock l(&mu_);
  if (!started_) {
    return {LoopOutcome::kFailed, absl::FailedPreconditionError("the step loop was not started"),
            0};
  }
  mu_.Await(absl::Condition(this, &StepLoop::ResultReady));
  return *result_;
}

std::optional<LoopResult> StepLoop::result() const {
  absl::MutexLock l(&mu_);
  return result_;
}

int64_t StepLoop::last_completed_step() const {
  absl::MutexLock l(&mu_);
  return last_completed_;
}

std::vector<MetricValue> StepLoop::MetricsSnapshot() const { return metrics_->Snapshot(); }

std::string StepLoop::telemetry_program() const {
  return reducer_ == nullptr ? std::string() : reducer_->program();
}

bool StepLoop::cancelled() const {
  absl::MutexLock l(&mu_);
  return cancel_;
}

void StepLoop::Run() {
  {
    absl::MutexLock l(&mu_);
    loop_thread_id_ = std::this_thread::get_id();
  }
  const absl::Status status = config_.grad != nullptr ? RunModeBSteps() : RunSteps();
  {
    absl::MutexLock l(&mu_);
    prefetch_shutdown_ = true;
  }
  prefetch_thread_.join();
  LoopResult result;
  {
    absl::MutexLock l(&mu_);
    prefetched_.reset();
    result.last_completed_step = last_completed_;
  }
  state_.clear();  // the job's device memory is released before anyone hears it ended
  grad_acc_.clear();
  if (status.ok()) {
    result.outcome = LoopOutcome::kSucceeded;
  } else if (absl::IsCancelled(status) && cancelled()) {
    result.outcome = LoopOutcome::kCancelled;
  } else {
    result.outcome = LoopOutcome::kFailed;
    result.error = status;
  }
  if (result.outcome == LoopOutcome::kFailed) {
    spdlog::error("job {} on {}: {}", config_.spec.job_id, config_.spec.host,
                  result.error.ToString());
  }
  if (config_.on_done) config_.on_done(result);
  absl::MutexLock l(&mu_);
  result_ = std::move(result);
}

absl::Status StepLoop::Initialize() {
  if (config_.restore_state) {
    const absl::Time start = config_.clock->Now();
    absl::StatusOr<DeviceBuffers> restored = config_.restore_state(devices_, partitions_);
    if (!restored.ok()) return PrefixStatus(restored.status(), "restoring the checkpoint: ");
    state_ = *std::move(restored);
    metrics_->AddTime(kTransferToDeviceTime, config_.clock->Now() - start);
    if (state_.size() != devices_.size()) {
      return absl::InternalError("the restored state does not cover the step's devices");
    }
    return absl::OkStatus();
  }
  const runtime::Executable& init = *config_.init;
  HostArray seed;
  bool takes_seed = true;
  DType seed_type = DType::kU32;
  if (init.signature().has_value()) {
    takes_seed = !init.signature()->inputs.empty();
    if (takes_seed) seed_type = init.signature()->inputs[0].shape.dtype;
  }
  if (seed_type == DType::kU32 || seed_type == DType::kS32) {
    seed = HostArray::From<uint32_t>(seed_type, {}, {static_cast<uint32_t>(config_.spec.seed)});
  } else {
    seed = HostArray::From<uint64_t>(seed_type, {}, {config_.spec.seed});
  }
  std::vector<std::unique_ptr<DeviceBuffer>> seeds;
  std::vector<std::vector<DeviceBuffer*>> args(devices_.size());
  for (size_t d = 0; d < devices_.size() && takes_seed; ++d) {
    const absl::Time start = config_.clock->Now();
    ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer,
                     config_.runtime->ToDevice(seed, devices_[d]));
    metrics_->AddTime(kTransferToDeviceTime, config_.clock->Now() - start);
    metrics_->AddBytes(kTransferToDeviceBytes, seed.shape.ByteSize());
    args[d].push_back(buffer.get());
    seeds.push_back(std::move(buffer));
  }
  const absl::Time start = config_.clock->Now();
  ASSIGN_OR_RETURN(state_, config_.runtime->Execute(init, args, {}));
  metrics_->AddTime(kExecuteTime, config_.clock->Now() - start);
  return absl::OkStatus();
}

absl::Status StepLoop::RunSteps() {
  const int64_t steps = config_.spec.steps;
  const runtime::Executable& step = *config_.step;
  const int num_state = config_.spec.num_state;
  if (cancelled()) return absl::CancelledError("cancelled before init");
  const int64_t first = config_.spec.first_step;
  if (first <= steps) RequestBatch(first);  // the first batch uploads while init runs
  if (absl::Status status = Initialize(); !status.ok()) return PrefixStatus(status, "init: ");
  for (int64_t s = first; s <= steps; ++s) {
    if (cancelled()) return absl::CancelledError(absl::StrCat("cancelled before step ", s));
    const absl::Time start = config_.clock->Now();
    absl::StatusOr<DeviceBuffers> batch = TakeBatch(s);
    if (!batch.ok()) {
      if (absl::IsCancelled(batch.status()) && cancelled()) return batch.status();
      return PrefixStatus(batch.status(), absl::StrCat("step ", s, ": "));
    }
    // Issue the next batch's upload before this step is launched, so that it overlaps it.
    if (s < steps) RequestBatch(s + 1);
    std::vector<std::vector<DeviceBuffer*>> args(devices_.size());
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (int i = 0; i < num_state; ++i) args[d].push_back(state_[d][i].get());
      for (const auto& buffer : (*batch)[d]) args[d].push_back(buffer.get());
    }
    const absl::Time launched = config_.clock->Now();
    absl::StatusOr<DeviceBuffers> outputs =
        config_.runtime->Execute(step, args, {.donate_inputs = donate_});
    if (!outputs.ok()) return PrefixStatus(outputs.status(), absl::StrCat("step ", s, ": "));
    batch->clear();
    RETURN_IF_ERROR(StepDone(s, start, launched, *outputs));
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (int i = 0; i < num_state; ++i) state_[d][i] = std::move((*outputs)[d][i]);
    }
    {
      absl::MutexLock l(&mu_);
      last_completed_ = s;
    }
    MaybeCheckpoint(s);
  }
  return absl::OkStatus();
}

void StepLoop::MaybeCheckpoint(int64_t s) {
  bool due = s == config_.spec.steps ||
             (config_.checkpoint_every > 0 && s % config_.checkpoint_every == 0);
  bool stop = false;
  {
    absl::MutexLock l(&mu_);
    due = due || checkpoint_requested_;
    stop = stop_after_checkpoint_;
    checkpoint_requested_ = false;
  }
  if (due && config_.checkpoint) {
    const int64_t micro = config_.grad != nullptr ? config_.spec.grad_accumulation : 1;
    const absl::Time start = config_.clock->Now();
    config_.checkpoint(s, state_, partitions_, s * micro);
    metrics_->AddTime(kCheckpointBlockingTime, config_.clock->Now() - start);
  }
  if (stop) Cancel();
}

void StepLoop::RequestCheckpoint(bool then_stop) {
  absl::MutexLock l(&mu_);
  checkpoint_requested_ = true;
  stop_after_checkpoint_ = stop_after_checkpoint_ || then_stop;
}

absl::Status StepLoop::ZeroAccumulators() {
  const std::vector<ArrayShape>& shapes = config_.grad->output_shapes();
  grad_acc_.clear();
  grad_acc_.resize(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    for (int i = 0; i < config_.spec.num_grad_acc; ++i) {
      const HostArray zeros{shapes[i], std::string(shapes[i].ByteSize(), '\0')};
      const absl::Time start = config_.clock->Now();
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer,
                       config_.runtime->ToDevice(zeros, devices_[d]));
      metrics_->AddTime(kTransferToDeviceTime, config_.clock->Now() - start);
      metrics_->AddBytes(kTransferToDeviceBytes, shapes[i].ByteSize());
      grad_acc_[d].push_back(std::move(buffer));
    }
  }
  return absl::OkStatus();
}

absl::Status StepLoop::RunModeBSteps() {
  const RunSpec& spec = config_.spec;
  const int64_t micro = spec.grad_accumulation;
  const int64_t total = spec.steps * micro;  // micro-batches over the run
  const int num_state = spec.num_state;
  if (cancelled()) return absl::CancelledError("cancelled before init");
  const int64_t first = spec.first_step;
  // The first micro-batch uploads while init runs.
  if (first <= spec.steps) RequestBatch((first - 1) * micro + 1);
  if (absl::Status status = Initialize(); !status.ok()) return PrefixStatus(status, "init: ");
  if (absl::Status status = ZeroAccumulators(); !status.ok()) {
    return PrefixStatus(status, "init: zero accumulators: ");
  }
  for (int64_t s = first; s <= spec.steps; ++s) {
    const absl::Time start = config_.clock->Now();
    for (int64_t m = 1; m <= micro; ++m) {
      if (cancelled()) {
        return absl::CancelledError(absl::StrCat("cancelled before step ", s, ", micro-step ", m));
      }
      const std::string where = absl::StrCat("step ", s, ", micro-step ", m);
      const int64_t index = (s - 1) * micro + m;
      absl::StatusOr<DeviceBuffers> batch = TakeBatch(index);
      if (!batch.ok()) {
        if (absl::IsCancelled(batch.status()) && cancelled()) return batch.status();
        return PrefixStatus(batch.status(), where + ": ");
      }
      if (index < total) RequestBatch(index + 1);
      std::vector<std::vector<DeviceBuffer*>> args(devices_.size());
      for (size_t d = 0; d < devices_.size(); ++d) {
        for (int i = 0; i < num_state; ++i) args[d].push_back(state_[d][i].get());
        for (const auto& buffer : grad_acc_[d]) args[d].push_back(buffer.get());
        for (const auto& buffer : (*batch)[d]) args[d].push_back(buffer.get());
      }
      const absl::Time launched = config_.clock->Now();
      absl::StatusOr<DeviceBuffers> outputs =
          config_.runtime->Execute(*config_.grad, args, {.donate_inputs = grad_donate_});
      if (!outputs.ok()) return PrefixStatus(outputs.status(), where + " (grad): ");
      metrics_->AddTime(kExecuteTime, config_.clock->Now() - launched);
      for (size_t d = 0; d < devices_.size(); ++d) {
        for (int i = 0; i < spec.num_grad_acc; ++i) grad_acc_[d][i] = std::move((*outputs)[d][i]);
      }
    }
    if (config_.reduce_gradients) {
      if (absl::Status status = config_.reduce_gradients(grad_acc_); !status.ok()) {
        return PrefixStatus(status, absl::StrCat("step ", s, ": gradient reduction: "));
      }
    }
    std::vector<std::vector<DeviceBuffer*>> args(devices_.size());
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (int i = 0; i < num_state; ++i) args[d].push_back(state_[d][i].get());
      for (const auto& buffer : grad_acc_[d]) args[d].push_back(buffer.get());
    }
    const absl::Time launched = config_.clock->Now();
    absl::StatusOr<DeviceBuffers> outputs =
        config_.runtime->Execute(*config_.apply, args, {.donate_inputs = donate_});
    if (!outputs.ok()) return PrefixStatus(outputs.status(), absl::StrCat("step ", s, " (apply): "));
    RETURN_IF_ERROR(StepDone(s, start, launched, *outputs));
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (int i = 0; i < num_state; ++i) state_[d][i] = std::move((*outputs)[d][i]);
      for (int i = 0; i < spec.num_grad_acc; ++i) {
        grad_acc_[d][i] = std::move((*outputs)[d][num_state + i]);
      }
    }
    {
      absl::MutexLock l(&mu_);
      last_completed_ = s;
    }
    MaybeCheckpoint(s);
  }
  return absl::OkStatus();
}

absl::Status StepLoop::StepDone(int64_t s, absl::Time start, absl::Time launched,
                                const DeviceBuffers& outputs) {
  const absl::Time done = config_.clock->Now();
  metrics_->AddTime(kExecuteTime, done - launched);
  metrics_->AddTime(kStepTime, done - start);
  metrics_->Increment(kSteps);
  if (!cadence_.IsLoggingStep(s)) return absl::OkStatus();
  // Reads the telemetry before the state moves on; nothing is donated in between.
  absl::Status status = EmitTelemetry(s, done - start, outputs);
  if (status.ok()) return status;
  absl::MutexLock l(&mu_);
  last_completed_ = s;  // the step itself completed
  return PrefixStatus(status, absl::StrCat("step ", s, ": telemetry: "));
}

absl::Status StepLoop::EmitTelemetry(int64_t step, absl::Duration step_time,
                                     const DeviceBuffers& outputs) {
  HostStepSummary summary{.job_id = config_.spec.job_id,
                          .step = step,
                          .host = config_.spec.host,
                          .replica_count = config_.spec.replica_count,
                          .step_time = step_time,
                          .synthetic_data = config_.spec.synthetic_data};
  if (reducer_ != nullptr) {
    std::vector<std::vector<DeviceBuffer*>> per_device(devices_.size());
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (int index : telemetry_index_) per_device[d].push_back(outputs[d][index].get());
    }
    const absl::Time start = config_.clock->Now();
    ASSIGN_OR_RETURN(summary.values, reducer_->Reduce(per_device));
    metrics_->AddTime(kTelemetryReduceTime, config_.clock->Now() - start);
    metrics_->Increment(kTelemetryReads);
  }
  summary.wall_time = config_.clock->Now();
  if (config_.sink) {
    const absl::Time start = config_.clock->Now();
    config_.sink(std::move(summary));
    const absl::Duration elapsed = config_.clock->Now() - start;
    metrics_->AddTime(kTelemetrySinkTime, elapsed);
    if (elapsed > config_.slow_sink_warning) {
      spdlog::warn("job {}: the telemetry sink took {} at step {}; it must enqueue and return",
                   config_.spec.job_id, absl::FormatDuration(elapsed), step);
    }
  }
  return absl::OkStatus();
}

bool StepLoop::BatchReadyOrCancelled() const { return prefetch_ready_step_ != 0 || cancel_; }

bool StepLoop::PrefetchWork() const { return prefetch_request_ != 0 || prefetch_shutdown_; }

void StepLoop::PrefetchMain() {
  while (true) {
    int64_t step;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &StepLoop::PrefetchWork));
      if (prefetch_shutdown_) return;
      step = prefetch_request_;
      prefetch_request_ = 0;
    }
    absl::StatusOr<DeviceBuffers> batch = FetchBatch();
    absl::MutexLock l(&mu_);
    prefetched_ = std::move(batch);
    prefetch_ready_step_ = step;
  }
}

void StepLoop::RequestBatch(int64_t step) {
  absl::MutexLock l(&mu_);
  prefetch_request_ = step;
}

absl::StatusOr<StepLoop::DeviceBuffers> StepLoop::TakeBatch(int64_t step) {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &StepLoop::BatchReadyOrCancelled));
  if (cancel_) return absl::CancelledError(absl::StrCat("cancelled before step ", step));
  if (prefetch_ready_step_ != step) {
    return absl::InternalError(absl::StrCat("prefetched batch ", prefetch_ready_step_,
                                            ", expected ", step));
  }
  absl::StatusOr<DeviceBuffers> batch = std::move(*prefetched_);
  prefetched_.reset();
  prefetch_ready_step_ = 0;
  return batch;
}

absl::StatusOr<StepLoop::DeviceBuffers> StepLoop::FetchBatch() {
  const RunSpec& spec = config_.spec;
  ASSIGN_OR_RETURN(std::vector<HostArray> arrays, config_.batches->Next());
  if (arrays.size() != spec.batch_sharding.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the batch has ", arrays.size(),
                                                   " arrays, the step takes ",
                                                   spec.batch_sharding.size(), " batch inputs"));
  }
  const std::optional<runtime::ProgramSignature>& signature = batch_program_->signature();
  auto input_name = [&](size_t a) {
    return signature.has_value() ? signature->inputs[batch_offset_ + a].name
                                 : absl::StrCat("batch input ", a);
  };
  for (size_t a = 0; a < arrays.size(); ++a) {
    const HostArray& array = arrays[a];
    if (array.shape.dtype == DType::kInvalid ||
        static_cast<int64_t>(array.bytes.size()) != array.shape.ByteSize()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch array '", input_name(a), "' is ", runtime::ToString(array.shape), " with ",
          array.bytes.size(), " bytes"));
    }
  }
  DeviceBuffers out(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    for (size_t a = 0; a < arrays.size(); ++a) {
      absl::StatusOr<HostArray> shard =
          runtime::ShardOf(arrays[a], spec.batch_sharding[a], spec.mesh_axes, spec.mesh_shape,
                           static_cast<int>(partitions_[d]));
      if (!shard.ok()) {
        return PrefixStatus(shard.status(), absl::StrCat("batch array '", input_name(a), "': "));
      }
      if (signature.has_value()) {
        const ArrayShape& expected = signature->inputs[batch_offset_ + a].shape;
        if (shard->shape != expected) {
          return absl::InvalidArgumentError(absl::StrCat(
              "batch array '", input_name(a), "' is ", runtime::ToString(arrays[a].shape),
              ", whose shards are ", runtime::ToString(shard->shape), "; the ",
              config_.grad != nullptr ? "grad program" : "step", " takes ",
              runtime::ToString(expected), " per device"));
        }
      }
      const absl::Time start = config_.clock->Now();
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer,
                       config_.runtime->ToDevice(*shard, devices_[d]));
      metrics_->AddTime(kTransferToDeviceTime, config_.clock->Now() - start);
      metrics_->AddBytes(kTransferToDeviceBytes, shard->shape.ByteSize());
      out[d].push_back(std::move(buffer));
    }
  }
  return out;
}

}  // namespace meshrun::worker
