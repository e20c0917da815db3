#include "bundle/job_bundle.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/path_roots.h"
#include "common/status_macros.h"

namespace meshrun::client {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// A bundle's files are read whole, so only regular files of a bounded size are (never a device
// such as /dev/zero, a FIFO, or a file past the cap: docs/limits.md).
constexpr int64_t kMaxBundleFileBytes = int64_t{2} << 30;

absl::StatusOr<std::string> ReadWhole(const std::string& path) {
  std::error_code error;
  const auto status = std::filesystem::status(path, error);
  if (error || !std::filesystem::exists(status)) {
    return absl::NotFoundError(absl::StrCat("cannot read ", path));
  }
  if (!std::filesystem::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const auto size = std::filesystem::file_size(path, error);
  if (error || static_cast<int64_t>(size) > kMaxBundleFileBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, " has ", size, " bytes; a bundle file ",
                                                   "may have at most ", kMaxBundleFileBytes));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Today's bundles write an unsplit dimension as null in a "sharding" list; the typed schema
// holds "" there (proto3 JSON has no null list elements).
void NullShardingToEmpty(Struct& s) {
  for (auto& [key, value] : *s.mutable_fields()) {
    if (value.has_struct_value()) {
      NullShardingToEmpty(*value.mutable_struct_value());
    } else if (value.has_list_value()) {
      for (Value& item : *value.mutable_list_value()->mutable_values()) {
        if (key == "sharding" && item.has_null_value()) item.set_string_value("");
        if (item.has_struct_value()) NullShardingToEmpty(*item.mutable_struct_value());
      }
    }
  }
}

absl::Status Invalid(const std::string& path, const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", field, " ", what));
}

bool HasProgram(const v1::BundleProgram& p) { return !p.file().empty(); }

absl::Status CheckProgram(const std::string& path, const std::string& field,
                          const v1::BundleProgram& p) {
  if (p.file().empty()) return Invalid(path, field + ".file", "is missing");
  if (!p.format().empty() && p.format() != "mlir") {
    return Invalid(path, field + ".format", "must be \"mlir\" (StableHLO), got \"" + p.format() + "\"");
  }
  for (int i : p.donated_inputs()) {
    if (i < 0 || i >= p.inputs_size()) {
      return Invalid(path, field + ".donated_inputs",
                     absl::StrCat("holds ", i, ", but the program has ", p.inputs_size(), " inputs"));
    }
  }
  return absl::OkStatus();
}

void AddProgram(const std::string& role, const v1::BundleProgram& from, std::string code,
                v1::JobSpec* spec) {
  v1::Program* p = spec->add_programs();
  p->set_role(role);
  p->set_stablehlo(std::move(code));
  *p->mutable_inputs() = from.inputs();
  *p->mutable_outputs() = from.outputs();
  *p->mutable_donated_inputs() = from.donated_inputs();
}

absl::StatusOr<v1::Combine> ParseCombineName(const std::string& field, const std::string& name) {
  v1::Combine combine;
  if (!v1::Combine_Parse("COMBINE_" + absl::AsciiStrToUpper(name), &combine) ||
      combine == v1::COMBINE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", name, "\" is not mean, max, min, sum or last"));
  }
  return combine;
}

absl::Status ConvertSparseAttention(const v1::BundleSparseAttention& in, v1::SparseAttention* out) {
  out->set_seq_len(in.seq_len());
  out->set_causal(in.causal());
  out->set_windowed(in.has_window_left() || in.has_window_right());
  out->set_window_left(in.window_left());
  out->set_window_right(in.window_right());
  out->set_block_q(in.block_q());
  out->set_block_kv(in.block_kv());
  out->set_max_grid_width(in.max_grid_width());
  out->set_heads_per_plan(in.heads_per_plan());
  out->set_doc_ids_input(in.doc_ids_input());
  for (const auto& [table, name] : in.table_inputs()) {
    std::string* input = table == "block_mask"      ? out->mutable_block_mask_input()
                         : table == "data_next"     ? out->mutable_data_next_input()
                         : table == "mask_next"     ? out->mutable_mask_next_input()
                         : table == "grid_width"    ? out->mutable_grid_width_input()
                         : table == "partial_masks" ? out->mutable_partial_masks_input()
                                                    : nullptr;
    if (input == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse_attention.table_inputs.", table,
          " is not block_mask, data_next, mask_next, grid_width or partial_masks"));
    }
    *input = name;
  }
  return absl::OkStatus();
}

// Whether `path` is one existing file that is not a token shard (docs/data.md: shards start
// with the magic "MRTOKSHD"): an array-batch file.
bool IsArrayFile(const std::string& path) {
  if (path.find_first_of("*?[") != std::string::npos) return false;
  std::ifstream in(path, std::ios::binary);
  if (!in) return false;
  char magic[8] = {};
  in.read(magic, sizeof(magic));
  return std::string(magic, static_cast<size_t>(in.gcount())) != "MRTOKSHD";
}

}  // namespace

std::string BundleDir(const std::string& job_json_path) {
  const std::string parent = std::filesystem::path(job_json_path).parent_path().string();
  return parent.empty() ? "." : parent;
}

absl::StatusOr<std::string> ReadBundleFile(const std::string& job_json_path,
                                           const std::string& file, const std::string& field,
                                           const PathRoots* roots) {
  std::string path = BundleDir(job_json_path) + "/" + file;
  if (roots != nullptr) {  // "../../etc/passwd", or a symlink out of the bundle: refused
    ASSIGN_OR_RETURN(path, roots->Resolve(std::filesystem::absolute(path).string(),
                                          absl::StrCat(job_json_path, ": ", field)));
  }
  absl::StatusOr<std::string> bytes = ReadWhole(path);
  if (!bytes.ok()) {
    return absl::NotFoundError(absl::StrCat(job_json_path, ": ", field, " names ", path,
                                            ", which cannot be read"));
  }
  return bytes;
}

std::string BundleJsonPath(const std::string& bundle) {
  std::error_code error;
  return std::filesystem::is_directory(bundle, error) ? bundle + "/job.json" : bundle;
}

absl::StatusOr<v1::JobBundle> ReadJobBundle(const std::string& bundle_path) {
  const std::string path = BundleJsonPath(bundle_path);
  absl::StatusOr<std::string> text = ReadWhole(path);
  if (!text.ok()) return absl::NotFoundError(absl::StrCat("bundle ", path, " cannot be read"));
  Struct root;
  if (auto s = google::protobuf::util::JsonStringToMessage(*text, &root); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, " is not valid JSON: ", s.message().as_string()));
  }
  NullShardingToEmpty(root);
  std::string normalized;
  (void)google::protobuf::util::MessageToJsonString(root, &normalized);
  v1::JobBundle bundle;
  if (auto s = google::protobuf::util::JsonStringToMessage(normalized, &bundle); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " is not a JobBundle (proto/meshrun/v1/bundle.proto): ", s.message().as_string()));
  }
  if (bundle.name().empty()) return Invalid(path, "name", "is missing");
  const v1::BundleMesh& mesh = bundle.mesh();
  if (mesh.axes_size() == 0) return Invalid(path, "mesh.axes", "is missing");
  if (mesh.shape_size() != mesh.axes_size()) {
    return Invalid(path, "mesh.shape", absl::StrCat("has ", mesh.shape_size(), " sizes for ",
                                                    mesh.axes_size(), " mesh.axes"));
  }
  for (const std::string& axis : mesh.axes()) {
    if (axis != "data" && axis != "model" && axis != "expert") {
      return Invalid(path, "mesh.axes",
                     "axis \"" + axis +
                         "\" is not mapped to a role (data, model or expert); export with "
                         "meshrun.export(..., axis_roles=...) or rename it");
    }
  }
  if (!bundle.model_family().empty() && bundle.model_family() != "dense" &&
      bundle.model_family() != "moe" && bundle.model_family() != "mamba") {
    return Invalid(path, "model_family", "\"" + bundle.model_family() + "\" is not dense, moe or mamba");
  }
  const v1::BundlePrograms& programs = bundle.programs();
  RETURN_IF_ERROR(CheckProgram(path, "programs.init", programs.init()));
  if (HasProgram(programs.grad()) || HasProgram(programs.apply())) {
    RETURN_IF_ERROR(CheckProgram(path, "programs.grad", programs.grad()));
    RETURN_IF_ERROR(CheckProgram(path, "programs.apply", programs.apply()));
    if (HasProgram(programs.step())) {
      return Invalid(path, "programs.step", "is set beside grad and apply (one compile mode)");
    }
    if (bundle.grad_accumulation() < 1) {
      return Invalid(path, "grad_accumulation", "must be >= 1 with grad and apply");
    }
  } else {
    RETURN_IF_ERROR(CheckProgram(path, "programs.step", programs.step()));
  }
  if (bundle.has_data() && bundle.data().file().empty()) {
    return Invalid(path, "data.file", "is missing");
  }
  return bundle;
}

absl::StatusOr<v1::JobSpec> JobSpecFromBundle(const std::string& bundle_path,
                                              const BundleOptions& options) {
  const std::string job_json_path = BundleJsonPath(bundle_path);
  if (options.steps < 1) return absl::InvalidArgumentError("--steps must be >= 1");
  if (options.telemetry_cadence < 1) return absl::InvalidArgumentError("--cadence must be >= 1");
  ASSIGN_OR_RETURN(v1::JobBundle bundle, ReadJobBundle(job_json_path));
  const v1::BundlePrograms& programs = bundle.programs();

  v1::JobSpec spec;
  spec.set_name(bundle.name());
  spec.set_model_family(bundle.model_family() == "moe"     ? v1::MODEL_FAMILY_MOE
                        : bundle.model_family() == "mamba" ? v1::MODEL_FAMILY_MAMBA
                                                           : v1::MODEL_FAMILY_DENSE);
  const bool mode_b = HasProgram(programs.grad());
  for (const auto& [role, program] :
       std::vector<std::pair<std::string, const v1::BundleProgram*>>{
           {"init", &programs.init()},
           {mode_b ? "grad" : "step", mode_b ? &programs.grad() : &programs.step()},
           {"apply", mode_b ? &programs.apply() : nullptr}}) {
    if (program == nullptr) continue;
    ASSIGN_OR_RETURN(std::string code,
                     ReadBundleFile(job_json_path, program->file(), "programs." + role + ".file"));
    AddProgram(role, *program, std::move(code), &spec);
  }
  if (mode_b) spec.set_grad_accumulation(bundle.grad_accumulation());
  spec.set_state_count(programs.init().outputs_size());
  for (int i = 0; i < bundle.telemetry_size(); ++i) {
    const v1::BundleTelemetry& t = bundle.telemetry(i);
    v1::TelemetryDeclaration* declared = spec.add_telemetry();
    // The series takes the bundle's name; older bundles without one keep the output's.
    declared->set_name(t.name().empty() ? t.output() : t.name());
    declared->set_output(t.output());
    ASSIGN_OR_RETURN(v1::Combine combine,
                     ParseCombineName(absl::StrCat("telemetry[", i, "].combine"), t.combine()));
    declared->set_combine(combine);
    *declared->mutable_shape() = t.shape();
    declared->set_caption(t.caption());
  }
  if (bundle.has_sparse_attention()) {
    RETURN_IF_ERROR(ConvertSparseAttention(bundle.sparse_attention(),
                                           spec.mutable_sparse_attention()));
  }
  spec.set_telemetry_cadence(options.telemetry_cadence);
  spec.set_steps(options.steps);
  v1::DataSource* data = spec.mutable_data();
  data->set_vocab_size(bundle.vocab_size());
  if (options.data.empty()) {
    data->set_example_bundle(std::filesystem::absolute(job_json_path).string());
  } else if (options.data == "synthetic") {
    data->set_synthetic(true);
  } else if (IsArrayFile(options.data)) {
    data->set_array_file(std::filesystem::absolute(options.data).string());
  } else {
    data->set_token_shards_glob(std::filesystem::absolute(options.data).string());
  }
  data->set_seed(bundle.seed());
  int dp = 1, tp = 1, ep = 1;
  for (int i = 0; i < bundle.mesh().axes_size(); ++i) {
    const std::string& axis = bundle.mesh().axes(i);
    const int size = static_cast<int>(bundle.mesh().shape(i));
    (axis == "data" ? dp : axis == "model" ? tp : ep) = size;
  }
  spec.mutable_mesh()->set_data_parallel(dp);
  spec.mutable_mesh()->set_tensor_parallel(tp);
  spec.mutable_mesh()->set_expert_parallel(ep);
  spec.mutable_mesh()->set_host_replicas(options.host_replicas > 0 ? options.host_replicas
                                                                   : bundle.mesh().host_replicas());
  return spec;
}

}  // namespace meshrun::client
