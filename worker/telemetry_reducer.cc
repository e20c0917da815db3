#include "worker/telemetry_reducer.h"

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
#include "runtime/compile_options.h"

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

using Series = TelemetryReducer::Series;
using ReducerConfig = TelemetryReducer::Config;

// Errors: INVALID_ARGUMENT naming what the config lacks or gets wrong.
absl::Status CheckConfig(const ReducerConfig& config) {
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
  return absl::OkStatus();
}

// The positions (into device_indices) whose shards of `s` the reduction combines: one per
// distinct coordinate along the mesh axes `s` is split over. Errors: INVALID_ARGUMENT naming the
// output (no elements, an unknown dtype, a NaN threshold, a sharding that does not fit).
absl::StatusOr<std::vector<int>> RepresentativesOf(const Series& s, const ReducerConfig& config) {
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
  for (size_t p = 0; p < config.device_indices.size(); ++p) {
    const std::vector<int64_t> coord = MeshCoord(config.partitions[p], config.mesh_shape);
    std::vector<int64_t> key;
    for (int a : axes) key.push_back(coord[a]);
    if (seen.insert(key).second) reps.push_back(static_cast<int>(p));
  }
  return reps;
}

// Emits the combine of `s` across its representatives' rows (`x`, this replica's 1 x n row):
// all-gather over the `replicas`, slice each representative, then max / min / sum / mean or the
// last partition's. Returns the combined row's value name.
std::string CombineAcrossDevices(Writer& w, const Series& s, const std::string& x,
                                 const std::vector<int>& reps, int replicas,
                                 const std::vector<int64_t>& partitions) {
  const int64_t n = s.shape.NumElements();
  const std::string row = TensorType({1, n}, "f32");
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
      if (partitions[reps[k]] > partitions[reps[last]]) last = k;
    }
    return parts[last];
  }
  const char* op = s.combine == Combine::kMax   ? "stablehlo.maximum"
                   : s.combine == Combine::kMin ? "stablehlo.minimum"
                                                : "stablehlo.add";
  std::string value = parts[0];
  for (size_t k = 1; k < parts.size(); ++k) {
    value = w.Op(absl::StrCat(op, " ", value, ", ", parts[k], " : ", row));
  }
  if (s.combine == Combine::kMean) {
    const std::string count = w.Op(absl::StrCat(
        "stablehlo.constant dense<", F32Literal(static_cast<float>(reps.size())), "> : ", row));
    value = w.Op(absl::StrCat("stablehlo.divide ", value, ", ", count, " : ", row));
  }
  return value;
}

// Emits the on-device threshold check of a flat f32[n] value: 1.0 when any element exceeds
// `threshold`, else 0.0, as f32[1]. Returns its value name.
std::string ThresholdFlag(Writer& w, const std::string& flat, int64_t n, double threshold) {
  const std::string flat_type = TensorType({n}, "f32");
  const std::string bound = w.Op(absl::StrCat(
      "stablehlo.constant dense<", F32Literal(static_cast<float>(threshold)), "> : ", flat_type));
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
  return w.Op(absl::StrCat("stablehlo.reshape ", as_float, " : (tensor<f32>) -> tensor<1xf32>"));
}

// The reduction program: every series flattened to f32 and combined across devices, then the
// threshold flags, concatenated into one f32[elements] output.
struct ReductionProgram {
  std::string mlir;
  int64_t elements = 0;
};
absl::StatusOr<ReductionProgram> BuildReductionProgram(
    const ReducerConfig& c, const std::vector<std::vector<int>>& representatives, int replicas) {
  Writer w;
  ReductionProgram program;
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
    const std::string value =
        representatives[i].size() > 1
            ? CombineAcrossDevices(w, s, x, representatives[i], replicas, c.partitions)
            : x;
    const std::string flat = w.Op(absl::StrCat("stablehlo.reshape ", value, " : (", row, ") -> ",
                                               TensorType({n}, "f32")));
    pieces.push_back(flat);
    if (s.threshold.has_value()) flags.push_back(ThresholdFlag(w, flat, n, *s.threshold));
    program.elements += n;
  }
  program.elements += static_cast<int64_t>(flags.size());
  const std::string out_type = TensorType({program.elements}, "f32");
  std::vector<std::string> all = pieces, types;
  all.insert(all.end(), flags.begin(), flags.end());
  for (const Series& s : c.series) types.push_back(TensorType({s.shape.NumElements()}, "f32"));
  types.resize(all.size(), "tensor<1xf32>");
  std::string result = all[0];
  if (all.size() > 1) {
    result = w.Op(absl::StrCat("stablehlo.concatenate ", absl::StrJoin(all, ", "),
                               ", dim = 0 : (", absl::StrJoin(types, ", "), ") -> ", out_type));
  }
  program.mlir = absl::StrCat(
      "module @meshrun_telemetry attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = ",
      replicas, " : i32} {\n  func.func public @main(", absl::StrJoin(params, ", "), ") -> ",
      out_type, " {\n", w.body(), "    return ", result, " : ", out_type, "\n  }\n}\n");
  return program;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TelemetryReducer>> TelemetryReducer::Create(Config config) {
  RETURN_IF_ERROR(CheckConfig(config));
  std::vector<std::vector<int>> representatives;  // per series
  bool collective = false;
  for (const Series& s : config.series) {
    ASSIGN_OR_RETURN(std::vector<int> reps, RepresentativesOf(s, config));
    collective = collective || reps.size() > 1;
    representatives.push_back(std::move(reps));
  }
  auto reducer = std::unique_ptr<TelemetryReducer>(new TelemetryReducer(std::move(config)));
  const Config& c = reducer->config_;
  // One replica per local device when some series needs a collective; else device 0 alone.
  const int replicas = collective ? static_cast<int>(c.device_indices.size()) : 1;
  ASSIGN_OR_RETURN(ReductionProgram program,
                   BuildReductionProgram(c, representatives, replicas));
  reducer->program_ = std::move(program.mlir);
  reducer->output_elements_ = program.elements;

  // Replica r runs on device_indices[r].
  const auto& addressable = c.runtime->addressable_devices();
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
    return absl::Status(executable.status().code(),
                        absl::StrCat("telemetry reduction program: ", executable.status().message()));
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

}  // namespace meshrun::worker
