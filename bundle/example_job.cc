#include "bundle/example_job.h"

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "bundle/array_file_format.h"
#include "bundle/job_bundle.h"
#include "common/path_roots.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace meshrun::runtime {
namespace {

absl::StatusOr<ExampleArray> ConvertArray(const v1::TensorSpec& t) {
  ExampleArray out;
  out.global.name = t.name();
  ASSIGN_OR_RETURN(out.global.shape.dtype, ParseDType(t.dtype()));
  out.global.shape.dims.assign(t.shape().begin(), t.shape().end());
  out.sharding.assign(t.sharding().begin(), t.sharding().end());
  out.shard.dtype = out.global.shape.dtype;
  out.shard.dims.assign(t.shard_shape().begin(), t.shard_shape().end());
  return out;
}

absl::StatusOr<std::vector<ExampleArray>> ConvertArrays(
    const google::protobuf::RepeatedPtrField<v1::TensorSpec>& list) {
  std::vector<ExampleArray> out;
  for (const v1::TensorSpec& t : list) {
    ASSIGN_OR_RETURN(ExampleArray a, ConvertArray(t));
    out.push_back(std::move(a));
  }
  return out;
}

absl::StatusOr<ExampleProgram> ConvertProgram(const std::string& job_json_path,
                                              const v1::BundleProgram& p, const std::string& role,
                                              const PathRoots* roots) {
  ExampleProgram out;
  ASSIGN_OR_RETURN(out.code, client::ReadBundleFile(job_json_path, p.file(),
                                                    "programs." + role + ".file", roots));
  ASSIGN_OR_RETURN(out.inputs, ConvertArrays(p.inputs()));
  ASSIGN_OR_RETURN(out.outputs, ConvertArrays(p.outputs()));
  out.donated_inputs.assign(p.donated_inputs().begin(), p.donated_inputs().end());
  return out;
}

absl::StatusOr<std::vector<float>> ReferenceSeries(const google::protobuf::Struct& reference,
                                                   const std::string& name) {
  std::vector<float> out;
  auto it = reference.fields().find(name);
  if (it == reference.fields().end()) return out;
  if (!it->second.has_list_value()) {
    return absl::InvalidArgumentError("reference '" + name + "' is not a list");
  }
  for (const auto& v : it->second.list_value().values()) {
    out.push_back(static_cast<float>(v.number_value()));
  }
  return out;
}

}  // namespace

ProgramSignature ExampleProgram::Signature() const {
  ProgramSignature signature;
  for (const ExampleArray& a : inputs) signature.inputs.push_back({a.global.name, a.shard});
  for (const ExampleArray& a : outputs) signature.outputs.push_back({a.global.name, a.shard});
  return signature;
}

int ExampleJob::OutputIndex(const std::string& name) const {
  const ExampleProgram& last = mode_b() ? apply : step;
  for (size_t i = 0; i < last.outputs.size(); ++i) {
    if (last.outputs[i].global.name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<ExampleJob> LoadExampleJob(const std::string& job_json_path,
                                          const PathRoots* roots) {
  if (roots != nullptr) {  // a directory's job.json may be a symlink out of it
    RETURN_IF_ERROR(roots->Resolve(std::filesystem::absolute(
                                       client::BundleJsonPath(job_json_path)).string(),
                                   "spec.data.example_bundle")
                        .status());
  }
  // The bundle itself through the product reader; the test fixtures are this loader's extras.
  ASSIGN_OR_RETURN(v1::JobBundle bundle, client::ReadJobBundle(job_json_path));
  ExampleJob job;
  job.name = bundle.name();
  job.mesh_axes.assign(bundle.mesh().axes().begin(), bundle.mesh().axes().end());
  job.mesh_shape.assign(bundle.mesh().shape().begin(), bundle.mesh().shape().end());
  job.device_ids.assign(bundle.mesh().device_ids().begin(), bundle.mesh().device_ids().end());
  const v1::BundlePrograms& programs = bundle.programs();
  ASSIGN_OR_RETURN(job.init, ConvertProgram(job_json_path, programs.init(), "init", roots));
  if (!programs.grad().file().empty()) {  // compile mode B: grad micro-steps, then apply
    ASSIGN_OR_RETURN(job.grad, ConvertProgram(job_json_path, programs.grad(), "grad", roots));
    ASSIGN_OR_RETURN(job.apply, ConvertProgram(job_json_path, programs.apply(), "apply", roots));
    job.grad_accumulation = bundle.grad_accumulation();
  } else {
    ASSIGN_OR_RETURN(job.step, ConvertProgram(job_json_path, programs.step(), "step", roots));
  }
  job.seed = bundle.seed();
  job.num_state = static_cast<int>(job.init.outputs.size());
  job.loss_output = job.OutputIndex("metrics.loss");
  if (job.loss_output < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(job.mode_b() ? "apply" : "step", " has no output metrics.loss"));
  }

  // The bundle's own batches; absent when the job trains on --data.
  if (bundle.has_data()) {
    ASSIGN_OR_RETURN(job.data_arrays, ConvertArrays(bundle.data().arrays()));
    ASSIGN_OR_RETURN(std::string bytes,
                     client::ReadBundleFile(job_json_path, bundle.data().file(), "data.file",
                                            roots));
    const int64_t steps = bundle.data().steps();
    // A typed file (meshrun.export writes one) starts with its header; older bundles' do not.
    ASSIGN_OR_RETURN(std::optional<bundle::ArrayFileHeaderRead> header,
                     bundle::ReadArrayFileHeader(bundle.data().file(), bytes));
    size_t offset = header.has_value() ? static_cast<size_t>(header->bytes) : 0;
    for (int64_t s = 0; s < steps * job.grad_accumulation; ++s) {
      std::vector<HostArray> batch;
      for (const ExampleArray& a : job.data_arrays) {
        const size_t size = static_cast<size_t>(a.global.shape.ByteSize());
        if (offset + size > bytes.size()) {
          return absl::InvalidArgumentError(absl::StrCat(
              job_json_path, ": data.file ", bundle.data().file(), " is too short for data.steps ",
              steps));
        }
        batch.push_back({a.global.shape, bytes.substr(offset, size)});
        offset += size;
      }
      job.batches.push_back(std::move(batch));
    }
  }

  // Test fixtures, optional: a bundle needs only what a run needs (meshrun.export writes
  // neither unless asked). When present they are read whole.
  if (!bundle.reference().empty()) {
    ASSIGN_OR_RETURN(std::string text,
                     client::ReadBundleFile(job_json_path, bundle.reference(), "reference", roots));
    google::protobuf::Struct reference;
    if (!google::protobuf::util::JsonStringToMessage(text, &reference).ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(job_json_path, ": reference ", bundle.reference(), " is not JSON"));
    }
    ASSIGN_OR_RETURN(job.reference_loss, ReferenceSeries(reference, "loss"));
    ASSIGN_OR_RETURN(job.reference_grad_norm, ReferenceSeries(reference, "grad_norm"));
  }
  if (!bundle.compile_options_jax().empty()) {
    ASSIGN_OR_RETURN(job.jax_compile_options,
                     client::ReadBundleFile(job_json_path, bundle.compile_options_jax(),
                                            "compile_options_jax", roots));
  }
  return job;
}

}  // namespace meshrun::runtime
