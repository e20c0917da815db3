#include "jobspec/spec_limits.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "runtime/compile_options.h"
#include "runtime/types.h"

namespace meshrun::jobspec {

absl::Status Invalid(const std::string& field, const std::string& problem) {
  return absl::InvalidArgumentError(absl::StrCat("spec.", field, " ", problem));
}

namespace {

using L = SpecLimits;

absl::Status CheckName(const std::string& value, const std::string& field) {
  if (static_cast<int64_t>(value.size()) > L::kMaxNameBytes) {
    return Invalid(field, absl::StrCat("is ", value.size(), " bytes; at most ", L::kMaxNameBytes));
  }
  for (unsigned char c : value) {
    if (c < 0x20 || c == 0x7f) {
      return Invalid(field, "holds a control character; use printable text");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckPath(const std::string& value, const std::string& field) {
  if (static_cast<int64_t>(value.size()) > L::kMaxPathBytes) {
    return Invalid(field, absl::StrCat("is ", value.size(), " bytes; at most ", L::kMaxPathBytes));
  }
  if (value.find('\0') != std::string::npos) return Invalid(field, "holds a NUL byte");
  return absl::OkStatus();
}

absl::Status CheckRange(int64_t value, int64_t low, int64_t high, const std::string& field) {
  if (value < low || value > high) {
    return Invalid(field, absl::StrCat("is ", value, "; it must be in [", low, ", ", high, "]"));
  }
  return absl::OkStatus();
}

std::vector<int64_t> Dims(const google::protobuf::RepeatedField<int64_t>& dims) {
  return {dims.begin(), dims.end()};
}

absl::Status CheckTensorBounds(const v1::TensorSpec& t, const std::string& field) {
  RETURN_IF_ERROR(CheckName(t.name(), field + ".name"));
  if (t.shape_size() > L::kMaxRank || t.shard_shape_size() > L::kMaxRank ||
      t.sharding_size() > L::kMaxRank) {
    return Invalid(field, absl::StrCat("has rank over ", L::kMaxRank));
  }
  RETURN_IF_ERROR(CheckedElements(Dims(t.shape()), "spec." + field + ".shape").status());
  ASSIGN_OR_RETURN(const int64_t shard,
                   CheckedElements(Dims(t.shard_shape()), "spec." + field + ".shard_shape"));
  if (absl::StatusOr<runtime::DType> dtype = runtime::ParseDType(t.dtype()); dtype.ok()) {
    const int64_t width = runtime::DTypeByteSize(*dtype);
    if (width > 0 && shard > L::kMaxShardBytes / width) {
      return Invalid(field + ".shard_shape",
                     absl::StrCat("makes ", shard, " elements of ", t.dtype(),
                                  " per device; at most ", L::kMaxShardBytes, " bytes"));
    }
  }
  for (int d = 0; d < t.sharding_size(); ++d) {
    RETURN_IF_ERROR(CheckName(t.sharding(d), absl::StrCat(field, ".sharding[", d, "]")));
  }
  return absl::OkStatus();
}

const v1::Program* ProgramOf(const v1::JobSpec& spec, const std::string& role) {
  for (const v1::Program& p : spec.programs()) {
    if (p.role() == role) return &p;
  }
  return nullptr;
}

std::string Describe(const v1::TensorSpec& t) {
  return absl::StrCat(t.dtype(), " [", absl::StrJoin(t.shape(), ", "), "] per device [",
                      absl::StrJoin(t.shard_shape(), ", "), "]");
}

bool SameArray(const v1::TensorSpec& a, const v1::TensorSpec& b) {
  return a.dtype() == b.dtype() && Dims(a.shape()) == Dims(b.shape()) &&
         Dims(a.shard_shape()) == Dims(b.shard_shape());
}

absl::Status CheckSharding(const v1::TensorSpec& t, const std::string& field) {
  static const std::set<std::string> kAxes = {"data", "model", "expert"};
  if (t.shard_shape_size() != t.shape_size()) {
    return Invalid(field + ".shard_shape",
                   absl::StrCat("has ", t.shard_shape_size(), " entries for ", t.shape_size(),
                                " dimensions; give what one device holds of each dimension"));
  }
  if (t.sharding_size() != 0 && t.sharding_size() != t.shape_size()) {
    return Invalid(field + ".sharding",
                   absl::StrCat("has ", t.sharding_size(), " entries for ", t.shape_size(),
                                " dimensions; give one axis (or \"\") per dimension, or none"));
  }
  for (int d = 0; d < t.shape_size(); ++d) {
    const std::string axis = t.sharding_size() > 0 ? t.sharding(d) : "";
    const int64_t global = t.shape(d);
    const int64_t local = t.shard_shape(d);
    if (!axis.empty() && !kAxes.contains(axis)) {
      return Invalid(absl::StrCat(field, ".sharding[", d, "]"),
                     absl::StrCat("\"", axis, "\" is not a mesh axis; use data, model, expert "
                                  "or \"\" (not split)"));
    }
    if (axis.empty() ? local != global
                     : (local <= 0 ? global != 0 : global % local != 0)) {
      return Invalid(absl::StrCat(field, ".shard_shape[", d, "]"),
                     absl::StrCat("is ", local, " but dimension ", d, " is ", global,
                                  axis.empty() ? " and not split: they must be equal"
                                               : absl::StrCat(" split over \"", axis,
                                                              "\": it must divide it")));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<int64_t> CheckedElements(const std::vector<int64_t>& dims,
                                        const std::string& field) {
  int64_t elements = 1;
  for (size_t d = 0; d < dims.size(); ++d) {
    if (dims[d] < 0 || dims[d] > L::kMaxDimension) {
      return absl::InvalidArgumentError(absl::StrCat(field, " dimension ", d, " is ", dims[d],
                                                     "; it must be in [0, ", L::kMaxDimension,
                                                     "]"));
    }
    if (__builtin_mul_overflow(elements, dims[d], &elements) ||
        elements > L::kMaxTensorElements) {
      return absl::InvalidArgumentError(absl::StrCat(
          field, " [", absl::StrJoin(dims, ", "), "] has over ", L::kMaxTensorElements,
          " elements"));
    }
  }
  return elements;
}

absl::Status CheckSpecBounds(const v1::JobSpec& spec) {
  RETURN_IF_ERROR(CheckName(spec.name(), "name"));
  if (spec.programs_size() > L::kMaxPrograms) {
    return Invalid("programs", absl::StrCat("has ", spec.programs_size(), " programs; at most ",
                                            L::kMaxPrograms, " (one per role)"));
  }
  for (int i = 0; i < spec.programs_size(); ++i) {
    const v1::Program& p = spec.programs(i);
    const std::string field = absl::StrCat("programs[", i, "]");
    RETURN_IF_ERROR(CheckName(p.role(), field + ".role"));
    if (static_cast<int64_t>(p.stablehlo().size()) > L::kMaxProgramBytes) {
      return Invalid(field + ".stablehlo", absl::StrCat("is ", p.stablehlo().size(),
                                                        " bytes; at most ", L::kMaxProgramBytes));
    }
    if (static_cast<int64_t>(p.compile_options().size()) > L::kMaxCompileOptionsBytes) {
      return Invalid(field + ".compile_options",
                     absl::StrCat("is ", p.compile_options().size(), " bytes; at most ",
                                  L::kMaxCompileOptionsBytes));
    }
    if (!p.compile_options().empty()) {
      RETURN_IF_ERROR(
          runtime::RebuildClientCompileOptions(p.compile_options(), field + ".compile_options")
              .status());
    }
    for (const auto& [list, tensors] : {std::pair{"inputs", &p.inputs()},
                                        std::pair{"outputs", &p.outputs()}}) {
      if (tensors->size() > L::kMaxTensorsPerProgram) {
        return Invalid(absl::StrCat(field, ".", list),
                       absl::StrCat("has ", tensors->size(), " tensors; at most ",
                                    L::kMaxTensorsPerProgram));
      }
      for (int j = 0; j < tensors->size(); ++j) {
        RETURN_IF_ERROR(CheckTensorBounds((*tensors)[j], absl::StrCat(field, ".", list, "[", j,
                                                                      "]")));
      }
    }
    if (p.donated_inputs_size() > p.inputs_size()) {
      return Invalid(field + ".donated_inputs", "lists more indices than the program has inputs");
    }
  }
  if (spec.telemetry_size() > L::kMaxTelemetry) {
    return Invalid("telemetry", absl::StrCat("declares ", spec.telemetry_size(),
                                             " series; at most ", L::kMaxTelemetry));
  }
  for (int i = 0; i < spec.telemetry_size(); ++i) {
    RETURN_IF_ERROR(CheckName(spec.telemetry(i).name(), absl::StrCat("telemetry[", i, "].name")));
    if (!spec.telemetry(i).output().empty()) {
      RETURN_IF_ERROR(
          CheckName(spec.telemetry(i).output(), absl::StrCat("telemetry[", i, "].output")));
    }
  }
  RETURN_IF_ERROR(CheckRange(spec.telemetry_cadence(), 0, L::kMaxCadence, "telemetry_cadence"));
  RETURN_IF_ERROR(CheckRange(spec.steps(), 0, L::kMaxSteps, "steps"));
  RETURN_IF_ERROR(CheckRange(spec.state_count(), 0, L::kMaxTensorsPerProgram, "state_count"));
  RETURN_IF_ERROR(
      CheckRange(spec.grad_accumulation(), 0, L::kMaxGradAccumulation, "grad_accumulation"));
  const v1::MeshRequest& mesh = spec.mesh();
  RETURN_IF_ERROR(CheckRange(mesh.data_parallel(), 0, L::kMaxMeshSize, "mesh.data_parallel"));
  RETURN_IF_ERROR(CheckRange(mesh.tensor_parallel(), 0, L::kMaxMeshSize, "mesh.tensor_parallel"));
  RETURN_IF_ERROR(CheckRange(mesh.expert_parallel(), 0, L::kMaxMeshSize, "mesh.expert_parallel"));
  RETURN_IF_ERROR(CheckRange(mesh.host_replicas(), 0, L::kMaxMeshSize, "mesh.host_replicas"));
  const v1::DataSource& data = spec.data();
  RETURN_IF_ERROR(CheckRange(data.global_batch(), 0, L::kMaxBatch, "data.global_batch"));
  RETURN_IF_ERROR(CheckRange(data.sequence_length(), 0, L::kMaxBatch, "data.sequence_length"));
  RETURN_IF_ERROR(CheckPath(data.token_shards_glob(), "data.token_shards_glob"));
  RETURN_IF_ERROR(CheckPath(data.example_bundle(), "data.example_bundle"));
  RETURN_IF_ERROR(CheckPath(spec.resume_from(), "resume_from"));
  RETURN_IF_ERROR(CheckPath(spec.checkpoint().directory(), "checkpoint.directory"));
  if (spec.has_max_restarts()) {
    RETURN_IF_ERROR(CheckRange(spec.max_restarts(), 0, L::kMaxRestarts, "max_restarts"));
  }
  return absl::OkStatus();
}

absl::Status CheckDeclarations(const v1::JobSpec& spec) {
  for (int i = 0; i < spec.programs_size(); ++i) {
    const v1::Program& p = spec.programs(i);
    const std::string field = absl::StrCat("programs[", i, "]");
    for (const auto& [list, tensors] : {std::pair{"inputs", &p.inputs()},
                                        std::pair{"outputs", &p.outputs()}}) {
      for (int j = 0; j < tensors->size(); ++j) {
        RETURN_IF_ERROR(CheckSharding((*tensors)[j], absl::StrCat(field, ".", list, "[", j, "]")));
      }
    }
    std::set<int> donated;
    for (int j = 0; j < p.donated_inputs_size(); ++j) {
      const int index = p.donated_inputs(j);
      const std::string entry = absl::StrCat(field, ".donated_inputs[", j, "]");
      if (index < 0 || index >= p.inputs_size()) {
        return Invalid(entry, absl::StrCat("is ", index, "; the ", p.role(), " program has ",
                                           p.inputs_size(), " inputs (0 to ",
                                           p.inputs_size() - 1, ")"));
      }
      if (!donated.insert(index).second) {
        return Invalid(entry, absl::StrCat("donates input ", index, " twice"));
      }
    }
  }
  // The state: the program that ends a step takes it first and returns it first, unchanged in
  // type and shape; init makes it; in mode B grad takes the same state.
  const int n = spec.state_count();
  const v1::Program* last = ProgramOf(spec, "apply");
  if (last == nullptr) last = ProgramOf(spec, "step");
  const v1::Program* init = ProgramOf(spec, "init");
  if (last != nullptr && n > 0) {
    if (last->outputs_size() < n) {
      return Invalid("state_count", absl::StrCat("is ", n, " but the ", last->role(),
                                                 " program returns ", last->outputs_size(),
                                                 " outputs; it must return the state first"));
    }
    for (int i = 0; i < n; ++i) {
      const v1::TensorSpec& in = last->inputs(i);
      const v1::TensorSpec& out = last->outputs(i);
      if (!SameArray(in, out)) {
        return Invalid(absl::StrCat("programs(", last->role(), ").outputs[", i, "]"),
                       absl::StrCat("\"", out.name(), "\" is ", Describe(out), " but state input ",
                                    i, " \"", in.name(), "\" is ", Describe(in),
                                    "; the state must come back unchanged in type and shape"));
      }
      if (init != nullptr && (init->outputs_size() < n || !SameArray(init->outputs(i), in))) {
        return Invalid(absl::StrCat("programs(init).outputs[", i, "]"),
                       absl::StrCat(init->outputs_size() < n
                                        ? std::string("is missing")
                                        : absl::StrCat("is ", Describe(init->outputs(i))),
                                    "; init must make state input ", i, " \"", in.name(),
                                    "\": ", Describe(in)));
      }
      for (const char* other : {"grad", "eval"}) {
        const v1::Program* p = ProgramOf(spec, other);
        if (p != nullptr && p != last && p->inputs_size() >= n && !SameArray(p->inputs(i), in)) {
          return Invalid(absl::StrCat("programs(", other, ").inputs[", i, "]"),
                         absl::StrCat("is ", Describe(p->inputs(i)), " but state input ", i,
                                      " \"", in.name(), "\" is ", Describe(in)));
        }
      }
    }
  }
  // Telemetry outputs are read to the host on every logging step: keep them small.
  for (int i = 0; last != nullptr && i < spec.telemetry_size(); ++i) {
    for (const v1::TensorSpec& out : last->outputs()) {
      if (out.name() != TelemetryOutputName(spec.telemetry(i))) continue;
      ASSIGN_OR_RETURN(const int64_t elements,
                       CheckedElements(Dims(out.shape()), absl::StrCat("spec.telemetry[", i, "]")));
      if (elements > L::kMaxTelemetryElements) {
        return Invalid(absl::StrCat("telemetry[", i, "]"),
                       absl::StrCat("\"", out.name(), "\" has ", elements, " elements; at most ",
                                    L::kMaxTelemetryElements, ": reduce it in the program"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSpecPaths(const v1::JobSpec& spec, const PathRoots& roots) {
  if (spec.data().has_token_shards_glob()) {
    RETURN_IF_ERROR(roots.CheckGlob(spec.data().token_shards_glob(),
                                    "spec.data.token_shards_glob"));
  }
  if (spec.data().has_array_file()) {
    RETURN_IF_ERROR(roots.Resolve(spec.data().array_file(), "spec.data.array_file").status());
  }
  if (spec.has_checkpoint()) {
    RETURN_IF_ERROR(
        roots.Resolve(spec.checkpoint().directory(), "spec.checkpoint.directory").status());
  }
  if (!spec.resume_from().empty()) {
    RETURN_IF_ERROR(roots.Resolve(spec.resume_from(), "spec.resume_from").status());
  }
  return absl::OkStatus();
}

absl::Status CheckWorkerSpecPaths(const v1::JobSpec& spec, const PathRoots& roots) {
  if (spec.data().has_example_bundle()) {
    RETURN_IF_ERROR(
        roots.Resolve(spec.data().example_bundle(), "spec.data.example_bundle").status());
  }
  return CheckSpecPaths(spec, roots);
}

absl::Status CheckShardingFitsMesh(const v1::JobSpec& spec,
                                   const std::vector<std::string>& axis_names,
                                   const std::vector<int64_t>& axis_sizes) {
  const std::string mesh =
      absl::StrCat("(", absl::StrJoin(axis_names, ", "), ") = [", absl::StrJoin(axis_sizes, ", "),
                   "]");
  for (int i = 0; i < spec.programs_size(); ++i) {
    const v1::Program& p = spec.programs(i);
    for (const auto& [list, tensors] : {std::pair{"inputs", &p.inputs()},
                                        std::pair{"outputs", &p.outputs()}}) {
      for (int j = 0; j < tensors->size(); ++j) {
        const v1::TensorSpec& t = (*tensors)[j];
        for (int d = 0; d < t.sharding_size() && d < t.shape_size() && d < t.shard_shape_size();
             ++d) {
          if (t.sharding(d).empty()) continue;
          const std::string field =
              absl::StrCat("programs[", i, "].", list, "[", j, "] \"", t.name(), "\"");
          int64_t size = 0;
          for (size_t a = 0; a < axis_names.size() && a < axis_sizes.size(); ++a) {
            if (axis_names[a] == t.sharding(d)) size = axis_sizes[a];
          }
          if (size == 0) {
            // A split over an axis of size 1 that the planner left out is no split.
            if (t.shard_shape(d) == t.shape(d)) continue;
            return Invalid(field, absl::StrCat("splits dimension ", d, " over \"", t.sharding(d),
                                               "\", which the planned mesh ", mesh,
                                               " does not have; request that axis in "
                                               "spec.mesh or re-export for this mesh"));
          }
          if (t.shard_shape(d) * size != t.shape(d)) {
            return Invalid(field, absl::StrCat(
                "splits dimension ", d, " (", t.shape(d), ") over \"", t.sharding(d),
                "\" of size ", size, " in the planned mesh ", mesh, ", which makes ",
                size > 0 && t.shape(d) % size == 0 ? absl::StrCat(t.shape(d) / size)
                                                   : std::string("no whole shard"),
                " per device, but shard_shape says ", t.shard_shape(d),
                "; re-export for this mesh or request the mesh it was exported for"));
          }
        }
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace meshrun::jobspec
