#include "worker/runtime/example_job.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "worker/runtime/compile_options.h"

namespace meshrun::runtime {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// A bundle's files are read whole, so only regular files of a bounded size are (never a device
// such as /dev/zero, a FIFO, or a file past the cap: docs/limits.md).
constexpr int64_t kMaxBundleFileBytes = int64_t{2} << 30;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
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

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

absl::StatusOr<Struct> ReadJson(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Struct out;
  auto status = google::protobuf::util::JsonStringToMessage(text, &out);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", status.ToString()));
  }
  return out;
}

absl::StatusOr<const Value*> Field(const Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  if (it == s.fields().end()) return absl::InvalidArgumentError("missing field '" + name + "'");
  return &it->second;
}

absl::StatusOr<const Struct*> Object(const Struct& s, const std::string& name) {
  ASSIGN_OR_RETURN(const Value* v, Field(s, name));
  if (!v->has_struct_value()) return absl::InvalidArgumentError("'" + name + "' is not an object");
  return &v->struct_value();
}

absl::StatusOr<const ListValue*> List(const Struct& s, const std::string& name) {
  ASSIGN_OR_RETURN(const Value* v, Field(s, name));
  if (!v->has_list_value()) return absl::InvalidArgumentError("'" + name + "' is not a list");
  return &v->list_value();
}

absl::StatusOr<std::string> String(const Struct& s, const std::string& name) {
  ASSIGN_OR_RETURN(const Value* v, Field(s, name));
  if (v->kind_case() != Value::kStringValue) {
    return absl::InvalidArgumentError("'" + name + "' is not a string");
  }
  return v->string_value();
}

absl::StatusOr<double> Number(const Struct& s, const std::string& name) {
  ASSIGN_OR_RETURN(const Value* v, Field(s, name));
  if (v->kind_case() != Value::kNumberValue) {
    return absl::InvalidArgumentError("'" + name + "' is not a number");
  }
  return v->number_value();
}

template <typename T>
absl::StatusOr<std::vector<T>> Numbers(const Struct& s, const std::string& name) {
  ASSIGN_OR_RETURN(const ListValue* list, List(s, name));
  std::vector<T> out;
  for (const Value& v : list->values()) out.push_back(static_cast<T>(v.number_value()));
  return out;
}

absl::StatusOr<std::vector<std::string>> Strings(const Struct& s, const std::string& name) {
  ASSIGN_OR_RETURN(const ListValue* list, List(s, name));
  std::vector<std::string> out;
  for (const Value& v : list->values()) {
    out.push_back(v.kind_case() == Value::kStringValue ? v.string_value() : "");
  }
  return out;
}

absl::StatusOr<ExampleArray> ParseArray(const Struct& s) {
  ExampleArray out;
  ASSIGN_OR_RETURN(out.global.name, String(s, "name"));
  ASSIGN_OR_RETURN(std::string dtype, String(s, "dtype"));
  ASSIGN_OR_RETURN(out.global.shape.dtype, ParseDType(dtype));
  ASSIGN_OR_RETURN(out.global.shape.dims, Numbers<int64_t>(s, "shape"));
  ASSIGN_OR_RETURN(out.sharding, Strings(s, "sharding"));
  out.shard.dtype = out.global.shape.dtype;
  ASSIGN_OR_RETURN(out.shard.dims, Numbers<int64_t>(s, "shard_shape"));
  return out;
}

absl::StatusOr<std::vector<ExampleArray>> ParseArrays(const Struct& s, const std::string& name) {
  ASSIGN_OR_RETURN(const ListValue* list, List(s, name));
  std::vector<ExampleArray> out;
  for (const Value& v : list->values()) {
    ASSIGN_OR_RETURN(ExampleArray a, ParseArray(v.struct_value()));
    out.push_back(std::move(a));
  }
  return out;
}

absl::StatusOr<ExampleProgram> ParseProgram(const Struct& s, const std::string& dir) {
  ExampleProgram out;
  ASSIGN_OR_RETURN(std::string file, String(s, "file"));
  ASSIGN_OR_RETURN(out.code, ReadFile(dir + "/" + file));
  ASSIGN_OR_RETURN(out.inputs, ParseArrays(s, "inputs"));
  ASSIGN_OR_RETURN(out.outputs, ParseArrays(s, "outputs"));
  if (s.fields().contains("donated_inputs")) {
    ASSIGN_OR_RETURN(out.donated_inputs, Numbers<int>(s, "donated_inputs"));
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

absl::StatusOr<ExampleJob> LoadExampleJob(const std::string& job_json_path) {
  const std::string dir = DirOf(job_json_path);
  ASSIGN_OR_RETURN(Struct root, ReadJson(job_json_path));
  ExampleJob job;
  ASSIGN_OR_RETURN(job.name, String(root, "name"));
  ASSIGN_OR_RETURN(const Struct* mesh, Object(root, "mesh"));
  ASSIGN_OR_RETURN(job.mesh_axes, Strings(*mesh, "axes"));
  ASSIGN_OR_RETURN(job.mesh_shape, Numbers<int64_t>(*mesh, "shape"));
  ASSIGN_OR_RETURN(job.device_ids, Numbers<int64_t>(*mesh, "device_ids"));
  ASSIGN_OR_RETURN(const Struct* programs, Object(root, "programs"));
  ASSIGN_OR_RETURN(const Struct* init, Object(*programs, "init"));
  ASSIGN_OR_RETURN(job.init, ParseProgram(*init, dir));
  if (programs->fields().contains("grad") || programs->fields().contains("apply")) {
    // Compile mode B: grad micro-steps, then apply.
    ASSIGN_OR_RETURN(const Struct* grad, Object(*programs, "grad"));
    ASSIGN_OR_RETURN(job.grad, ParseProgram(*grad, dir));
    ASSIGN_OR_RETURN(const Struct* apply, Object(*programs, "apply"));
    ASSIGN_OR_RETURN(job.apply, ParseProgram(*apply, dir));
    ASSIGN_OR_RETURN(double micro_steps, Number(root, "grad_accumulation"));
    job.grad_accumulation = static_cast<int>(micro_steps);
    if (job.grad_accumulation < 1) {
      return absl::InvalidArgumentError("grad_accumulation must be >= 1");
    }
  } else {
    ASSIGN_OR_RETURN(const Struct* step, Object(*programs, "step"));
    ASSIGN_OR_RETURN(job.step, ParseProgram(*step, dir));
  }
  ASSIGN_OR_RETURN(double seed, Number(root, "seed"));
  job.seed = static_cast<uint32_t>(seed);
  job.num_state = static_cast<int>(job.init.outputs.size());
  job.loss_output = job.OutputIndex("metrics.loss");
  if (job.loss_output < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(job.mode_b() ? "apply" : "step", " has no output metrics.loss"));
  }

  // The bundle's own batches; absent when the job trains on token shards (--data).
  if (root.fields().contains("data")) {
    ASSIGN_OR_RETURN(const Struct* data, Object(root, "data"));
    ASSIGN_OR_RETURN(job.data_arrays, ParseArrays(*data, "arrays"));
    ASSIGN_OR_RETURN(std::string data_file, String(*data, "file"));
    ASSIGN_OR_RETURN(double steps, Number(*data, "steps"));
    ASSIGN_OR_RETURN(std::string bytes, ReadFile(dir + "/" + data_file));
    size_t offset = 0;
    for (int s = 0; s < static_cast<int>(steps) * job.grad_accumulation; ++s) {
      std::vector<HostArray> batch;
      for (const ExampleArray& a : job.data_arrays) {
        const size_t size = static_cast<size_t>(a.global.shape.ByteSize());
        if (offset + size > bytes.size()) {
          return absl::InvalidArgumentError(absl::StrCat(data_file, " is too short for ", steps,
                                                         " steps"));
        }
        batch.push_back({a.global.shape, bytes.substr(offset, size)});
        offset += size;
      }
      job.batches.push_back(std::move(batch));
    }
  }

  // Test fixtures, optional: a bundle needs only what a run needs (meshrun.export writes
  // neither unless asked). When present they are read whole.
  if (root.fields().contains("reference")) {
    ASSIGN_OR_RETURN(std::string reference_file, String(root, "reference"));
    ASSIGN_OR_RETURN(Struct reference, ReadJson(dir + "/" + reference_file));
    ASSIGN_OR_RETURN(job.reference_loss, Numbers<float>(reference, "loss"));
    if (reference.fields().contains("grad_norm")) {
      ASSIGN_OR_RETURN(job.reference_grad_norm, Numbers<float>(reference, "grad_norm"));
    }
  }
  if (root.fields().contains("compile_options_jax")) {
    ASSIGN_OR_RETURN(std::string options_file, String(root, "compile_options_jax"));
    ASSIGN_OR_RETURN(job.jax_compile_options, ReadFile(dir + "/" + options_file));
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
    for (int i = 0; i < job_.num_state; ++i) args[p].push_back(state_[p][i].get());
    for (const auto& buffer : batch[p]) args[p].push_back(buffer.get());
  }
  ASSIGN_OR_RETURN(auto outputs,
                   runtime_->Execute(*step_, args, {.donate_inputs = job_.step.donated_inputs}));
  std::vector<HostArray> values;
  for (int output : read) {
    ASSIGN_OR_RETURN(HostArray value, runtime_->ToHost(*outputs[0][output]));
    values.push_back(std::move(value));
  }
  // The step's state outputs are the next step's state inputs; metrics are dropped.
  for (size_t p = 0; p < outputs.size(); ++p) {
    outputs[p].resize(job_.num_state);
    state_[p] = std::move(outputs[p]);
  }
  return values;
}

}  // namespace meshrun::runtime
