#include "services/job_bundle.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/runtime/example_job.h"

namespace meshrun::services {
namespace {

void AddTensors(const std::vector<runtime::ExampleArray>& arrays,
                google::protobuf::RepeatedPtrField<v1::TensorSpec>* out) {
  for (const runtime::ExampleArray& a : arrays) {
    v1::TensorSpec* t = out->Add();
    t->set_name(a.global.name);
    t->set_dtype(std::string(runtime::DTypeName(a.global.shape.dtype)));
    for (int64_t d : a.global.shape.dims) t->add_shape(d);
    for (const std::string& axis : a.sharding) t->add_sharding(axis);
    for (int64_t d : a.shard.dims) t->add_shard_shape(d);
  }
}

void AddProgram(const std::string& role, const runtime::ExampleProgram& program,
                v1::JobSpec* spec) {
  v1::Program* p = spec->add_programs();
  p->set_role(role);
  p->set_stablehlo(program.code);
  AddTensors(program.inputs, p->mutable_inputs());
  AddTensors(program.outputs, p->mutable_outputs());
  for (int i : program.donated_inputs) p->add_donated_inputs(i);
}

absl::StatusOr<v1::Combine> ParseCombineName(const std::string& name) {
  v1::Combine combine;
  if (!v1::Combine_Parse("COMBINE_" + absl::AsciiStrToUpper(name), &combine) ||
      combine == v1::COMBINE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat("telemetry combine \"", name, "\" is not mean, max, min, sum or last"));
  }
  return combine;
}

// The bundle's "sparse_attention" object (examples/export_examples.py) as the JobSpec's
// contract; ValidateJobSpec checks the values at submit.
absl::Status ParseSparseAttention(const google::protobuf::Struct& json, v1::SparseAttention* out) {
  const auto& f = json.fields();
  auto number = [&](const char* key) {
    return f.contains(key) ? static_cast<int32_t>(f.at(key).number_value()) : 0;
  };
  auto text = [&](const char* key) { return f.contains(key) ? f.at(key).string_value() : ""; };
  out->set_seq_len(number("seq_len"));
  out->set_causal(f.contains("causal") && f.at("causal").bool_value());
  out->set_windowed(f.contains("window_left") || f.contains("window_right"));
  out->set_window_left(number("window_left"));
  out->set_window_right(number("window_right"));
  out->set_block_q(number("block_q"));
  out->set_block_kv(number("block_kv"));
  out->set_max_grid_width(number("max_grid_width"));
  out->set_heads_per_plan(number("heads_per_plan"));
  out->set_doc_ids_input(text("doc_ids_input"));
  if (!f.contains("table_inputs")) return absl::OkStatus();
  const std::map<std::string, std::string*> inputs = {
      {"block_mask", out->mutable_block_mask_input()},
      {"data_next", out->mutable_data_next_input()},
      {"mask_next", out->mutable_mask_next_input()},
      {"grid_width", out->mutable_grid_width_input()},
      {"partial_masks", out->mutable_partial_masks_input()}};
  for (const auto& [table, name] : f.at("table_inputs").struct_value().fields()) {
    auto it = inputs.find(table);
    if (it == inputs.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse_attention.table_inputs.", table,
          " is not block_mask, data_next, mask_next, grid_width or partial_masks"));
    }
    *it->second = name.string_value();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> JobSpecFromBundle(const std::string& job_json_path,
                                              const BundleOptions& options) {
  if (options.steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  if (options.telemetry_cadence < 1) return absl::InvalidArgumentError("--cadence must be >= 1");
  ASSIGN_OR_RETURN(runtime::ExampleJob job, runtime::LoadExampleJob(job_json_path));

  // The bundle's own declarations (family, telemetry), which ExampleJob does not carry.
  std::ifstream in(job_json_path);
  std::stringstream text;
  text << in.rdbuf();
  google::protobuf::Struct root;
  if (!google::protobuf::util::JsonStringToMessage(text.str(), &root).ok()) {
    return absl::InvalidArgumentError(absl::StrCat(job_json_path, " is not valid JSON"));
  }

  v1::JobSpec spec;
  spec.set_name(job.name);
  const auto& fields = root.fields();
  const std::string family =
      fields.contains("model_family") ? fields.at("model_family").string_value() : "dense";
  spec.set_model_family(family == "moe"     ? v1::MODEL_FAMILY_MOE
                        : family == "mamba" ? v1::MODEL_FAMILY_MAMBA
                                            : v1::MODEL_FAMILY_DENSE);
  AddProgram("init", job.init, &spec);
  if (job.mode_b()) {
    AddProgram("grad", job.grad, &spec);
    AddProgram("apply", job.apply, &spec);
    spec.set_grad_accumulation(job.grad_accumulation);
  } else {
    AddProgram("step", job.step, &spec);
  }
  spec.set_state_count(job.num_state);
  if (fields.contains("telemetry")) {
    for (const auto& entry : fields.at("telemetry").list_value().values()) {
      const auto& t = entry.struct_value().fields();
      v1::TelemetryDeclaration* declared = spec.add_telemetry();
      declared->set_name(t.contains("output") ? t.at("output").string_value() : "");
      ASSIGN_OR_RETURN(v1::Combine combine, ParseCombineName(t.contains("combine")
                                                                 ? t.at("combine").string_value()
                                                                 : ""));
      declared->set_combine(combine);
      if (t.contains("shape")) {
        for (const auto& d : t.at("shape").list_value().values()) {
          declared->add_shape(static_cast<int64_t>(d.number_value()));
        }
      }
    }
  }
  if (fields.contains("sparse_attention")) {
    RETURN_IF_ERROR(ParseSparseAttention(fields.at("sparse_attention").struct_value(),
                                         spec.mutable_sparse_attention()));
  }
  spec.set_telemetry_cadence(options.telemetry_cadence);
  spec.set_steps(options.steps);
  if (options.data.empty()) {
    spec.mutable_data()->set_example_bundle(std::filesystem::absolute(job_json_path).string());
  } else if (options.data == "synthetic") {
    spec.mutable_data()->set_synthetic(true);
  } else {
    spec.mutable_data()->set_token_shards_glob(std::filesystem::absolute(options.data).string());
  }
  spec.mutable_data()->set_seed(job.seed);
  int dp = 1, tp = 1, ep = 1;
  for (size_t i = 0; i < job.mesh_axes.size(); ++i) {
    const int size = static_cast<int>(job.mesh_shape[i]);
    if (job.mesh_axes[i] == "data") dp = size;
    if (job.mesh_axes[i] == "model") tp = size;
    if (job.mesh_axes[i] == "expert") ep = size;
    if (job.mesh_axes[i] != "data" && job.mesh_axes[i] != "model" &&
        job.mesh_axes[i] != "expert") {
      return absl::InvalidArgumentError(absl::StrCat(
          "mesh.axes: axis \"", job.mesh_axes[i],
          "\" is not mapped to a role (data, model or expert); export with "
          "meshrun.export(..., axis_roles=...) or rename it"));
    }
  }
  spec.mutable_mesh()->set_data_parallel(dp);
  spec.mutable_mesh()->set_tensor_parallel(tp);
  spec.mutable_mesh()->set_expert_parallel(ep);
  int host_replicas = options.host_replicas;
  if (host_replicas == 0 && fields.contains("mesh")) {
    const auto& mesh = fields.at("mesh").struct_value().fields();
    if (mesh.contains("host_replicas")) {
      host_replicas = static_cast<int>(mesh.at("host_replicas").number_value());
    }
  }
  spec.mutable_mesh()->set_host_replicas(host_replicas);
  return spec;
}

}  // namespace meshrun::services
