#include "runtime/compile_options.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "common/status_macros.h"
#include "runtime/xla_compile_options.pb.h"

namespace meshrun::runtime {
namespace {

namespace wire = ::meshrun::runtime::xla;

// What JAX 0.8.1 writes for ExecutableBuildOptions.memory_fitting_level (EFFORT_O2); set so
// that meshrun compiles with the same effort as JAX does for the same program.
constexpr int32_t kMemoryFittingLevelO2 = 29;

std::string SerializeDeterministic(const google::protobuf::MessageLite& message) {
  std::string out;
  google::protobuf::io::StringOutputStream stream(&out);
  google::protobuf::io::CodedOutputStream coded(&stream);
  coded.SetSerializationDeterministic(true);
  message.SerializeToCodedStream(&coded);
  coded.Trim();
  return out;
}

absl::StatusOr<wire::CompileOptionsProto> ParseWire(absl::string_view bytes) {
  wire::CompileOptionsProto proto;
  if (!proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a serialized XLA CompileOptions message (", bytes.size(), " bytes)"));
  }
  proto.DiscardUnknownFields();
  return proto;
}

}  // namespace

CompileOptionsSpec SpmdCompileOptions(std::vector<int64_t> device_ids) {
  CompileOptionsSpec spec;
  spec.num_partitions = static_cast<int>(device_ids.size());
  spec.device_assignment = {std::move(device_ids)};
  return spec;
}

absl::StatusOr<std::string> BuildCompileOptions(const CompileOptionsSpec& spec) {
  if (spec.num_replicas < 1 || spec.num_partitions < 1) {
    return absl::InvalidArgumentError(absl::StrCat("replica and partition counts must be >= 1, got ",
                                                   spec.num_replicas, " x ", spec.num_partitions));
  }
  if (spec.process_count < 1 || spec.process_index < 0 ||
      spec.process_index >= spec.process_count) {
    return absl::InvalidArgumentError(absl::StrCat("process_index ", spec.process_index,
                                                   " is not in [0, ", spec.process_count, ")"));
  }
  wire::CompileOptionsProto proto;
  proto.set_profile_version(-1);  // no profile, as JAX writes it
  wire::ExecutableBuildOptionsProto& build = *proto.mutable_executable_build_options();
  build.set_device_ordinal(-1);
  build.set_num_replicas(spec.num_replicas);
  build.set_num_partitions(spec.num_partitions);
  build.set_use_spmd_partitioning(spec.use_spmd_partitioning);
  build.set_use_shardy_partitioner(spec.use_shardy_partitioner);
  // Shardings come from the program; XLA must not rewrite its parameter or result shardings.
  build.add_allow_spmd_sharding_propagation_to_output(false);
  build.add_allow_spmd_sharding_propagation_to_parameters(false);
  build.set_process_index(spec.process_index);
  build.set_process_count(spec.process_count);
  build.set_memory_fitting_level(kMemoryFittingLevelO2);
  for (const auto& [name, value] : spec.xla_flags) {
    wire::OptionOverrideProto& flag = (*proto.mutable_env_option_overrides())[name];
    if (const bool* b = std::get_if<bool>(&value)) {
      flag.set_bool_field(*b);
    } else {
      flag.set_int_field(std::get<int64_t>(value));
    }
  }
  if (!spec.device_assignment.empty()) {
    if (static_cast<int>(spec.device_assignment.size()) != spec.num_replicas) {
      return absl::InvalidArgumentError(absl::StrCat("device assignment has ",
                                                     spec.device_assignment.size(),
                                                     " replicas, expected ", spec.num_replicas));
    }
    std::set<int64_t> seen;
    wire::DeviceAssignmentProto& assignment = *build.mutable_device_assignment();
    assignment.set_replica_count(spec.num_replicas);
    assignment.set_computation_count(spec.num_partitions);
    for (int p = 0; p < spec.num_partitions; ++p) {
      auto& computation = *assignment.add_computation_devices();
      for (int r = 0; r < spec.num_replicas; ++r) {
        const std::vector<int64_t>& row = spec.device_assignment[r];
        if (static_cast<int>(row.size()) != spec.num_partitions) {
          return absl::InvalidArgumentError(absl::StrCat("device assignment replica ", r, " has ",
                                                         row.size(), " partitions, expected ",
                                                         spec.num_partitions));
        }
        if (row[p] < 0 || !seen.insert(row[p]).second) {
          return absl::InvalidArgumentError(
              absl::StrCat("device assignment: id ", row[p], " is negative or repeated"));
        }
        computation.add_replica_device_ids(row[p]);
      }
    }
  }
  return SerializeDeterministic(proto);
}

absl::StatusOr<CompileOptionsSpec> ParseCompileOptions(absl::string_view bytes) {
  ASSIGN_OR_RETURN(wire::CompileOptionsProto proto, ParseWire(bytes));
  const wire::ExecutableBuildOptionsProto& build = proto.executable_build_options();
  CompileOptionsSpec spec;
  spec.num_replicas = static_cast<int>(build.num_replicas());
  spec.num_partitions = static_cast<int>(build.num_partitions());
  spec.use_spmd_partitioning = build.use_spmd_partitioning();
  spec.use_shardy_partitioner = build.use_shardy_partitioner();
  spec.process_index = static_cast<int>(build.process_index());
  spec.process_count = static_cast<int>(build.process_count());
  for (const auto& [name, flag] : proto.env_option_overrides()) {
    if (flag.has_bool_field()) spec.xla_flags[name] = flag.bool_field();
    if (flag.has_int_field()) spec.xla_flags[name] = flag.int_field();
  }
  if (build.has_device_assignment()) {
    const wire::DeviceAssignmentProto& assignment = build.device_assignment();
    spec.device_assignment.assign(assignment.replica_count(), {});
    for (const auto& computation : assignment.computation_devices()) {
      if (computation.replica_device_ids_size() != assignment.replica_count()) {
        return absl::InvalidArgumentError("device assignment rows disagree with replica_count");
      }
      for (int r = 0; r < assignment.replica_count(); ++r) {
        spec.device_assignment[r].push_back(computation.replica_device_ids(r));
      }
    }
  }
  return spec;
}

bool IsUserXlaFlag(absl::string_view name) {
  // Scheduling, fusion and collective-overlap switches users of TPU slices tune; none names a
  // path, a dump, a profile or a plugin.
  static const auto* flags = new std::set<std::string, std::less<>>{
      "xla_tpu_enable_latency_hiding_scheduler",
      "xla_tpu_enable_async_collective_fusion",
      "xla_tpu_enable_async_collective_fusion_fuse_all_gather",
      "xla_tpu_enable_async_collective_fusion_multiple_steps",
      "xla_tpu_overlap_compute_collective_tc",
      "xla_tpu_enable_data_parallel_all_reduce_opt",
      "xla_tpu_data_parallel_opt_different_sized_ops",
      "xla_tpu_megacore_fusion_allow_ags",
      "xla_enable_async_collective_permute",
      "xla_enable_async_all_gather",
      "xla_enable_async_reduce_scatter",
      "xla_enable_async_all_reduce",
      "xla_latency_hiding_scheduler_rerun",
      "xla_cpu_enable_fast_math",
      "xla_cpu_use_thunk_runtime",
  };
  return flags->contains(name);
}

namespace {

// XLA's names for the fields meshrun does not model, by message and number, for the refusal.
std::string XlaFieldName(bool build_options, int number) {
  static const auto* top = new std::map<int, std::string>{
      {1, "argument_layouts"}, {2, "parameter_is_tupled_arguments"},
      {4, "compile_portable_executable"}, {6, "serialized_multi_slice_config"},
      {8, "target_config"}};
  static const auto* build = new std::map<int, std::string>{
      {2, "result_layout"}, {3, "debug_options"},
      {7, "use_auto_spmd_partitioning"}, {8, "deduplicate_hlo"}, {14, "fdo_profile"},
      {15, "device_memory_size"}};
  const auto& names = build_options ? *build : *top;
  auto it = names.find(number);
  const std::string where = build_options ? "executable_build_options." : "";
  return it == names.end() ? absl::StrCat(where, "field ", number)
                           : absl::StrCat(where, it->second, " (field ", number, ")");
}

absl::Status RefuseField(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(
      field, " sets ", what, ", which a job may not set: meshrun builds compile options itself "
      "from replicas, partitions, the device assignment and the optimisation flags of "
      "docs/limits.md; remove it, or leave ", field, " empty"));
}

}  // namespace

absl::StatusOr<std::string> RebuildClientCompileOptions(absl::string_view bytes,
                                                        const std::string& field) {
  wire::CompileOptionsProto proto;
  if (!proto.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, " is not a serialized XLA CompileOptions message (", bytes.size(), " bytes)"));
  }
  const auto& reflection = *proto.GetReflection();
  if (const auto& unknown = reflection.GetUnknownFields(proto); unknown.field_count() > 0) {
    return RefuseField(field, XlaFieldName(false, unknown.field(0).number()));
  }
  const wire::ExecutableBuildOptionsProto& build = proto.executable_build_options();
  if (const auto& unknown = build.GetReflection()->GetUnknownFields(build);
      unknown.field_count() > 0) {
    return RefuseField(field, XlaFieldName(true, unknown.field(0).number()));
  }
  if (build.has_device_assignment()) {
    const wire::DeviceAssignmentProto& assignment = build.device_assignment();
    bool unknown = assignment.GetReflection()->GetUnknownFields(assignment).field_count() > 0;
    for (const auto& computation : assignment.computation_devices()) {
      unknown |= computation.GetReflection()->GetUnknownFields(computation).field_count() > 0;
    }
    if (unknown) return RefuseField(field, "an unknown field of the device assignment");
  }
  for (const auto& [name, flag] : proto.env_option_overrides()) {
    if (!IsUserXlaFlag(name)) {
      return RefuseField(field, absl::StrCat("the XLA flag ", name));
    }
    if (!flag.has_bool_field() && !flag.has_int_field()) {
      return RefuseField(field, absl::StrCat("the XLA flag ", name, " to a string or a float "
                                             "(it takes a bool or an integer)"));
    }
  }
  ASSIGN_OR_RETURN(CompileOptionsSpec spec, ParseCompileOptions(bytes));
  if (spec.process_count == 0) spec.process_count = 1;  // unset: one process
  absl::StatusOr<std::string> rebuilt = BuildCompileOptions(spec);
  if (!rebuilt.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": ", rebuilt.status().message()));
  }
  return rebuilt;
}

absl::StatusOr<std::string> CanonicalCompileOptions(absl::string_view bytes) {
  ASSIGN_OR_RETURN(wire::CompileOptionsProto proto, ParseWire(bytes));
  return SerializeDeterministic(proto);
}

}  // namespace meshrun::runtime
