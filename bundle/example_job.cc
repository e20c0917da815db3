#include "worker/runtime/example_job.h"

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "client/job_bundle.h"
#include "common/clock.h"
#include "common/path_roots.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "worker/runtime/compile_options.h"

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
    size_t offset = 0;
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

absl::StatusOr<HostArray> ShardOf(const HostArray& global, const std::vector<std::string>& sharding,
                                  const std::vector<std::string>& mesh_axes,
                                  const std::vector<int64_t>& mesh_shape, int partition) {
  const std::vector<int64_t>& dims = global.shape.dims;
  // Partition p sits at the row-major coordinate p of the mesh.
  std::vector<int64_t> coord(mesh_shape.size());
  for (int a = static_cast<int>(mesh_shape.size()) - 1, p = partition; a >= 0; --a) {
    coord[a] = p % mesh_shape[a];
    p /= static_cast<int>(mesh_shape[a]);
  }
  std::vector<int64_t> start(dims.size(), 0), size = dims;
  for (size_t i = 0; i < dims.size() && i < sharding.size(); ++i) {
    if (sharding[i].empty()) continue;
    size_t a = 0;
    while (a < mesh_axes.size() && mesh_axes[a] != sharding[i]) ++a;
    if (a == mesh_axes.size()) {
      return absl::InvalidArgumentError("unknown mesh axis '" + sharding[i] + "'");
    }
    if (dims[i] % mesh_shape[a] != 0) {
      return absl::InvalidArgumentError(absl::StrCat("dimension ", i, " of ", ToString(global.shape),
                                                     " does not split ", mesh_shape[a], " ways"));
    }
    size[i] = dims[i] / mesh_shape[a];
    start[i] = coord[a] * size[i];
  }
  const int64_t element = DTypeByteSize(global.shape.dtype);
  HostArray out{{global.shape.dtype, size}, {}};
  out.bytes.resize(static_cast<size_t>(out.shape.ByteSize()));
  // Copy the block row by row along the last dimension.
  const size_t rank = dims.size();
  const int64_t row = rank == 0 ? 1 : size[rank - 1];
  std::vector<int64_t> index(rank, 0);
  for (int64_t dst = 0; dst < out.shape.NumElements(); dst += row) {
    int64_t src = 0;
    for (size_t i = 0; i < rank; ++i) src = src * dims[i] + start[i] + index[i];
    std::memcpy(out.bytes.data() + dst * element, global.bytes.data() + src * element,
                static_cast<size_t>(row * element));
    for (int i = static_cast<int>(rank) - 2; i >= 0; --i) {  // next row
      if (++index[i] < size[i]) break;
      index[i] = 0;
    }
  }
  return out;
}

absl::StatusOr<std::unique_ptr<ExampleRunner>> ExampleRunner::Create(Runtime* runtime,
                                                                     ExampleJob job,
                                                                     bool load_step_serialized) {
  if (job.mode_b()) {
    return absl::InvalidArgumentError(absl::StrCat(
        job.name, " is a compile mode B job (grad + apply); the step loop runs those"));
  }
  auto runner = std::unique_ptr<ExampleRunner>(new ExampleRunner(runtime, std::move(job)));
  const ExampleJob& j = runner->job_;
  ASSIGN_OR_RETURN(std::string options, BuildCompileOptions(SpmdCompileOptions(j.device_ids)));
  ASSIGN_OR_RETURN(runner->init_,
                   runtime->Compile({j.init.code, "mlir", options, j.init.Signature()}));
  const absl::Time start = RealClock().Now();
  ASSIGN_OR_RETURN(runner->step_,
                   runtime->Compile({j.step.code, "mlir", options, j.step.Signature()}));
  runner->step_compile_time_ = RealClock().Now() - start;
  if (load_step_serialized) {
    ASSIGN_OR_RETURN(std::string bytes, runtime->Serialize(*runner->step_));
    ASSIGN_OR_RETURN(runner->step_, runtime->DeserializeAndLoad(bytes, j.step.Signature()));
  }
  // Partition p must run on device_ids[p].
  const std::vector<int>& devices = runner->step_->device_indices();
  for (size_t p = 0; p < devices.size(); ++p) {
    if (runtime->addressable_devices()[devices[p]].global_id != j.device_ids[p]) {
      return absl::InternalError(absl::StrCat("partition ", p, " runs on ",
                                              runtime->addressable_devices()[devices[p]].runtime_name,
                                              ", expected device ", j.device_ids[p]));
    }
  }
  return runner;
}

absl::Status ExampleRunner::Initialize() {
  RETURN_IF_ERROR(Finish());
  const std::vector<int>& devices = init_->device_indices();
  std::vector<std::unique_ptr<DeviceBuffer>> seeds;
  std::vector<std::vector<DeviceBuffer*>> args;
  for (int device : devices) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<DeviceBuffer> seed,
        runtime_->ToDevice(HostArray::From<uint32_t>(DType::kU32, {}, {job_.seed}), device));
    args.push_back({seed.get()});
    seeds.push_back(std::move(seed));
  }
  ASSIGN_OR_RETURN(state_, runtime_->Execute(*init_, args, {}));
  batches_.clear();
  for (const std::vector<HostArray>& batch : job_.batches) {
    std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> per_device(devices.size());
    for (size_t p = 0; p < devices.size(); ++p) {
      for (size_t a = 0; a < batch.size(); ++a) {
        ASSIGN_OR_RETURN(HostArray shard, ShardOf(batch[a], job_.data_arrays[a].sharding,
                                                  job_.mesh_axes, job_.mesh_shape,
                                                  static_cast<int>(p)));
        ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer,
                         runtime_->ToDevice(shard, devices[p]));
        per_device[p].push_back(std::move(buffer));
      }
    }
    batches_.push_back(std::move(per_device));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<HostArray>> ExampleRunner::Step(int index, const std::vector<int>& read) {
  if (state_.empty() || batches_.empty()) {
    return absl::FailedPreconditionError("call Initialize before Step");
  }
  const auto& batch = batches_[index % batches_.size()];
  std::vector<std::vector<DeviceBuffer*>> args(state_.size());
  for (size_t p = 0; p < state_.size(); ++p) {
    args[p].reserve(job_.num_state + batch[p].size());
    for (int i = 0; i < job_.num_state; ++i) args[p].push_back(state_[p][i].get());
    for (const auto& buffer : batch[p]) args[p].push_back(buffer.get());
  }
  ASSIGN_OR_RETURN(LaunchedExecution launched,
                   runtime_->Launch(*step_, args, {.donate_inputs = job_.step.donated_inputs}));
  RETURN_IF_ERROR(Finish());  // the previous step, now that this one is queued behind it
  in_flight_ = std::move(launched.done);
  auto& outputs = launched.outputs;
  std::vector<HostArray> values;
  for (int output : read) {
    ASSIGN_OR_RETURN(HostArray value, runtime_->ToHost(*outputs[0][output]));
    values.push_back(std::move(value));
  }
  // The step's state outputs are the next step's state inputs; the rest waits with the step.
  for (size_t p = 0; p < outputs.size(); ++p) {
    for (int i = 0; i < job_.num_state; ++i) state_[p][i] = std::move(outputs[p][i]);
  }
  in_flight_outputs_ = std::move(outputs);
  return values;
}

absl::Status ExampleRunner::Finish() {
  if (in_flight_ == nullptr) return absl::OkStatus();
  absl::Status status = in_flight_->Await();
  in_flight_.reset();
  in_flight_outputs_.clear();
  return status;
}

}  // namespace meshrun::runtime
