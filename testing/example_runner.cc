#include "testing/example_runner.h"

#include "absl/strings/str_cat.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "runtime/compile_options.h"
#include "runtime/shard.h"

namespace meshrun::runtime {

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
