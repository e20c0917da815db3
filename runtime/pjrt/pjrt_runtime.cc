#include "runtime/pjrt/pjrt_runtime.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <typeinfo>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "runtime/hlo_signature.h"
#include "runtime/pjrt/pjrt_api.h"
#include "runtime/pjrt/pjrt_objects.h"
#include "runtime/pjrt/pjrt_target_compiler.h"
#include "xla/pjrt/c/pjrt_c_api.h"

namespace meshrun::runtime {

using pjrt::AwaitEvent;
using pjrt::ErrorToStatus;
using pjrt::FromPjrt;
using pjrt::NamedValueToString;
using pjrt::Plugin;
using pjrt::ToPjrt;

namespace {

using State = PjrtRuntime::State;
using pjrt::BufferShape;
using pjrt::PjrtBuffer;
using pjrt::PjrtExecutable;
using pjrt::WithExecutable;

absl::StatusOr<DeviceDescription> Describe(const PJRT_Api* api, PJRT_Device* device,
                                           const std::string& platform) {
  PJRT_ARGS(PJRT_Device_GetDescription_Args, get);
  get.device = device;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Device_GetDescription, get));
  return pjrt::DescribeDevice(api, get.device_description, platform);
}

void AddTransfer(TransferCounter& counter, int64_t bytes, absl::Duration time) {
  ++counter.count;
  counter.bytes += bytes;
  counter.time += time;
}

}  // namespace

// ---- PjrtRuntime ----

PjrtRuntime::PjrtRuntime(std::shared_ptr<State> state) : state_(std::move(state)) {}
PjrtRuntime::~PjrtRuntime() = default;

absl::StatusOr<std::unique_ptr<PjrtRuntime>> PjrtRuntime::Create(const RuntimeConfig& config) {
  ASSIGN_OR_RETURN(const Plugin* plugin, pjrt::LoadPlugin(config.plugin_path));
  const PJRT_Api* api = plugin->api;
  auto state = std::make_shared<State>();
  state->plugin = plugin;
  state->api = api;
  state->kv = config.kv_client;
  state->clock = config.clock != nullptr ? config.clock : &RealClock();

  std::vector<std::string> names;  // PJRT_NamedValue points into these
  std::vector<std::string> strings;
  std::vector<PJRT_NamedValue> options;
  std::map<std::string, CreateOptionValue> all = config.create_options;
  if (config.cpu_device_count) all["cpu_device_count"] = *config.cpu_device_count;
  names.reserve(all.size());
  strings.reserve(all.size());
  for (const auto& [name, value] : all) {
    PJRT_ARGS(PJRT_NamedValue, option);
    names.push_back(name);
    option.name = names.back().c_str();
    option.name_size = name.size();
    option.value_size = 1;
    if (const auto* i = std::get_if<int64_t>(&value)) {
      option.type = PJRT_NamedValue_kInt64;
      option.int64_value = *i;
    } else if (const auto* b = std::get_if<bool>(&value)) {
      option.type = PJRT_NamedValue_kBool;
      option.bool_value = *b;
    } else {
      strings.push_back(std::get<std::string>(value));
      option.type = PJRT_NamedValue_kString;
      option.string_value = strings.back().c_str();
      option.value_size = strings.back().size();
    }
    options.push_back(option);
  }
  PJRT_ARGS(PJRT_Client_Create_Args, create);
  create.create_options = options.data();
  create.num_options = options.size();
  if (state->kv != nullptr) {
    create.kv_get_callback = pjrt::KvGet;
    create.kv_get_user_arg = state->kv.get();
    create.kv_put_callback = pjrt::KvPut;
    create.kv_put_user_arg = state->kv.get();
    create.kv_try_get_callback = pjrt::KvTryGet;
    create.kv_try_get_user_arg = state->kv.get();
  }
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Client_Create, create));
  state->client = create.client;

  PJRT_ARGS(PJRT_Client_PlatformName_Args, platform);
  platform.client = state->client;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Client_PlatformName, platform));
  PJRT_ARGS(PJRT_Client_PlatformVersion_Args, version);
  version.client = state->client;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Client_PlatformVersion, version));
  state->identity = RuntimeIdentity{
      .platform_name = std::string(platform.platform_name, platform.platform_name_size),
      .platform_version = std::string(version.platform_version, version.platform_version_size),
      .pjrt_api_major = static_cast<uint32_t>(api->pjrt_api_version.major_version),
      .pjrt_api_minor = static_cast<uint32_t>(api->pjrt_api_version.minor_version),
      .plugin_sha256 = plugin->sha256};

  PJRT_ARGS(PJRT_Client_Devices_Args, devices);
  devices.client = state->client;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Client_Devices, devices));
  for (size_t i = 0; i < devices.num_devices; ++i) {
    ASSIGN_OR_RETURN(DeviceDescription d,
                     Describe(api, devices.devices[i], state->identity.platform_name));
    state->devices.push_back(std::move(d));
  }
  PJRT_ARGS(PJRT_Client_AddressableDevices_Args, addressable);
  addressable.client = state->client;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Client_AddressableDevices, addressable));
  for (size_t i = 0; i < addressable.num_addressable_devices; ++i) {
    PJRT_Device* device = addressable.addressable_devices[i];
    ASSIGN_OR_RETURN(DeviceDescription d, Describe(api, device, state->identity.platform_name));
    d.local_id = static_cast<int32_t>(i);
    if (PJRT_HAS(api, PJRT_Device_LocalHardwareId)) {
      PJRT_ARGS(PJRT_Device_LocalHardwareId_Args, hw);
      hw.device = device;
      if (PJRT_CALL(api, PJRT_Device_LocalHardwareId, hw).ok()) {
        d.attributes["local_hardware_id"] = absl::StrCat(hw.local_hardware_id);
      }
    }
    for (DeviceDescription& global : state->devices) {
      if (global.global_id == d.global_id) global.local_id = d.local_id;
    }
    state->device_index[device] = static_cast<int>(i);
    state->addressable_handles.push_back(device);
    state->addressable.push_back(std::move(d));
  }
  return std::unique_ptr<PjrtRuntime>(new PjrtRuntime(std::move(state)));
}

const RuntimeIdentity& PjrtRuntime::identity() const { return state_->identity; }
const std::vector<DeviceDescription>& PjrtRuntime::devices() const { return state_->devices; }
const std::vector<DeviceDescription>& PjrtRuntime::addressable_devices() const {
  return state_->addressable;
}
const std::map<std::string, std::string>& PjrtRuntime::plugin_attributes() const {
  return state_->plugin->attributes;
}

absl::StatusOr<std::unique_ptr<Executable>> PjrtRuntime::Compile(const ProgramSource& program) {
  const PJRT_Api* api = state_->api;
  PJRT_ARGS(PJRT_Program, source);
  source.code = const_cast<char*>(program.code.data());
  source.code_size = program.code.size();
  source.format = program.format.data();
  source.format_size = program.format.size();
  PJRT_ARGS(PJRT_Client_Compile_Args, compile);
  compile.client = state_->client;
  compile.program = &source;
  compile.compile_options = program.compile_options.data();
  compile.compile_options_size = program.compile_options.size();
  absl::Status status = PJRT_CALL(api, PJRT_Client_Compile, compile);
  if (status.code() == absl::StatusCode::kUnknown) {
    // XLA reports programs its MLIR parser or verifier rejects as UNKNOWN; to callers that is a
    // bad argument. The plugin's own code stays in the message.
    return absl::InvalidArgumentError(
        absl::StrCat("program rejected (plugin code UNKNOWN): ", status.message()));
  }
  RETURN_IF_ERROR(status);
  auto executable = std::make_unique<PjrtExecutable>(state_, compile.executable);
  RETURN_IF_ERROR(executable->Describe(program.signature));
  return executable;
}

absl::StatusOr<std::string> PjrtRuntime::Serialize(const Executable& executable) {
  const PJRT_Api* api = state_->api;
  const auto* exe = dynamic_cast<const PjrtExecutable*>(&executable);
  if (exe == nullptr || exe->state() != state_.get()) {
    return absl::InvalidArgumentError("executable was not made by this runtime");
  }
  if (!PJRT_HAS(api, PJRT_Executable_Serialize)) {
    return absl::UnimplementedError("PJRT plugin has no PJRT_Executable_Serialize");
  }
  std::string out;
  RETURN_IF_ERROR(WithExecutable(api, exe->handle(), [&](PJRT_Executable* handle) {
    PJRT_ARGS(PJRT_Executable_Serialize_Args, serialize);
    serialize.executable = handle;
    RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Executable_Serialize, serialize));
    out.assign(serialize.serialized_bytes, serialize.serialized_bytes_size);
    serialize.serialized_executable_deleter(serialize.serialized_executable);
    return absl::OkStatus();
  }));
  return out;
}

absl::StatusOr<ExecutableStats> PjrtRuntime::Stats(const Executable& executable) {
  const auto* exe = dynamic_cast<const PjrtExecutable*>(&executable);
  if (exe == nullptr || exe->state() != state_.get()) {
    return absl::InvalidArgumentError("executable was not made by this runtime");
  }
  ExecutableStats stats;
  RETURN_IF_ERROR(WithExecutable(state_->api, exe->handle(), [&](PJRT_Executable* handle) {
    stats = pjrt::ReadExecutableStats(state_->api, handle);
    return absl::OkStatus();
  }));
  return stats;
}

absl::StatusOr<std::unique_ptr<Executable>> PjrtRuntime::DeserializeAndLoad(
    absl::string_view serialized, std::optional<ProgramSignature> signature) {
  const PJRT_Api* api = state_->api;
  if (!PJRT_HAS(api, PJRT_Executable_DeserializeAndLoad)) {
    return absl::UnimplementedError("PJRT plugin has no PJRT_Executable_DeserializeAndLoad");
  }
  PJRT_ARGS(PJRT_Executable_DeserializeAndLoad_Args, load);
  load.client = state_->client;
  load.serialized_executable = serialized.data();
  load.serialized_executable_size = serialized.size();
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Executable_DeserializeAndLoad, load));
  auto executable = std::make_unique<PjrtExecutable>(state_, load.loaded_executable);
  RETURN_IF_ERROR(executable->Describe(std::move(signature)));
  return executable;
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> PjrtRuntime::ToDevice(const HostArray& array,
                                                                    int device_index) {
  const PJRT_Api* api = state_->api;
  if (device_index < 0 || static_cast<size_t>(device_index) >= state_->addressable.size()) {
    return absl::InvalidArgumentError(absl::StrCat("device index ", device_index, " is not in [0, ",
                                                   state_->addressable.size(), ")"));
  }
  const PJRT_Buffer_Type type = ToPjrt(array.shape.dtype);
  if (type == PJRT_Buffer_Type_INVALID) return absl::InvalidArgumentError("invalid dtype");
  if (static_cast<int64_t>(array.bytes.size()) != array.shape.ByteSize()) {
    return absl::InvalidArgumentError(absl::StrCat(ToString(array.shape), " needs ",
                                                   array.shape.ByteSize(), " bytes, got ",
                                                   array.bytes.size()));
  }
  const absl::Time start = state_->clock->Now();
  PJRT_ARGS(PJRT_Client_BufferFromHostBuffer_Args, args);
  args.client = state_->client;
  args.data = array.bytes.data();
  args.type = type;
  args.dims = array.shape.dims.data();
  args.num_dims = array.shape.dims.size();
  args.host_buffer_semantics = PJRT_HostBufferSemantics_kImmutableUntilTransferCompletes;
  args.device = state_->addressable_handles[device_index];
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Client_BufferFromHostBuffer, args));
  auto buffer = std::make_unique<PjrtBuffer>(state_, args.buffer, array.shape, device_index);
  RETURN_IF_ERROR(AwaitEvent(api, args.done_with_host_buffer, "host buffer release"));
  PJRT_ARGS(PJRT_Buffer_ReadyEvent_Args, ready);
  ready.buffer = args.buffer;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Buffer_ReadyEvent, ready));
  RETURN_IF_ERROR(AwaitEvent(api, ready.event, "host-to-device transfer"));
  const absl::Duration elapsed = state_->clock->Now() - start;
  absl::MutexLock lock(&state_->mu);
  AddTransfer(state_->counters.host_to_device, array.shape.ByteSize(), elapsed);
  return buffer;
}

absl::StatusOr<HostArray> PjrtRuntime::ToHost(const DeviceBuffer& buffer) {
  const PJRT_Api* api = state_->api;
  const auto* pjrt_buffer = dynamic_cast<const PjrtBuffer*>(&buffer);
  if (pjrt_buffer == nullptr || pjrt_buffer->state() != state_.get()) {
    return absl::InvalidArgumentError("buffer was not made by this runtime");
  }
  if (buffer.IsDeleted()) {
    return absl::FailedPreconditionError("buffer was donated to an execution or deleted");
  }
  const absl::Time start = state_->clock->Now();
  HostArray out{buffer.shape(), {}};
  PJRT_ARGS(PJRT_Buffer_ToHostBuffer_Args, args);
  args.src = pjrt_buffer->handle();
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Buffer_ToHostBuffer, args));  // asks for the size
  out.bytes.resize(args.dst_size);
  args.dst = out.bytes.data();
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Buffer_ToHostBuffer, args));
  RETURN_IF_ERROR(AwaitEvent(api, args.event, "device-to-host transfer"));
  const absl::Duration elapsed = state_->clock->Now() - start;
  absl::MutexLock lock(&state_->mu);
  AddTransfer(state_->counters.device_to_host, static_cast<int64_t>(out.bytes.size()), elapsed);
  return out;
}

namespace {

// Launch's per-thread arrays (see there).
struct LaunchScratch {
  std::vector<PJRT_Buffer*> inputs;
  std::vector<PJRT_Buffer* const*> input_lists;
  std::vector<PJRT_Buffer*> outputs;
  std::vector<PJRT_Buffer**> output_lists;
};

// One launched execution's per-device completion events, awaited once.
class PjrtExecution final : public ExecutionEvent {
 public:
  PjrtExecution(std::shared_ptr<State> state, std::vector<PJRT_Event*> events, absl::Time start)
      : state_(std::move(state)), events_(std::move(events)), start_(start) {}
  ~PjrtExecution() override {
    for (PJRT_Event* event : events_) {
      if (event == nullptr) continue;
      PJRT_ARGS(PJRT_Event_Destroy_Args, destroy);
      destroy.event = event;
      state_->api->PJRT_Event_Destroy(&destroy);
    }
  }
  absl::Status Await() override {
    if (awaited_) return status_;
    awaited_ = true;
    for (PJRT_Event*& event : events_) {
      absl::Status device_status = AwaitEvent(state_->api, event, "execution");  // destroys it
      event = nullptr;
      if (status_.ok()) status_ = device_status;
    }
    const absl::Duration elapsed = state_->clock->Now() - start_;
    absl::MutexLock lock(&state_->mu);
    state_->counters.execute_time += elapsed;
    return status_;
  }

 private:
  std::shared_ptr<State> state_;
  std::vector<PJRT_Event*> events_;
  absl::Time start_;
  bool awaited_ = false;
  absl::Status status_;
};

}  // namespace

absl::StatusOr<std::vector<std::vector<std::unique_ptr<DeviceBuffer>>>> PjrtRuntime::Execute(
    const Executable& executable, absl::Span<const std::vector<DeviceBuffer*>> args,
    const ExecuteOptions& options) {
  ASSIGN_OR_RETURN(LaunchedExecution launched, Launch(executable, args, options));
  RETURN_IF_ERROR(launched.done->Await());
  return std::move(launched.outputs);
}

absl::StatusOr<LaunchedExecution> PjrtRuntime::Launch(
    const Executable& executable, absl::Span<const std::vector<DeviceBuffer*>> args,
    const ExecuteOptions& options) {
  const PJRT_Api* api = state_->api;
  const auto* exe = dynamic_cast<const PjrtExecutable*>(&executable);
  if (exe == nullptr || exe->state() != state_.get()) {
    return absl::InvalidArgumentError("executable was not made by this runtime");
  }
  // Donated or deleted inputs are refused by PJRT itself before anything runs, so the check
  // that asks the plugin about each input runs only to name the input once a launch failed.
  RETURN_IF_ERROR(CheckExecuteArgs(executable, args, options, state_->addressable,
                                   /*check_donation_state=*/false));
  const size_t num_devices = args.size();
  const size_t num_args = num_devices == 0 ? 0 : args[0].size();
  const size_t num_outputs = exe->num_outputs();
  // The flat argument and output arrays live in this thread's scratch, reused from launch to
  // launch: at 8 devices x ~20 inputs they exceed 1 KiB, and glibc serves a request that size
  // only after consolidating its fast bins, which the plugin's freed buffer objects fill each
  // step (~11k instructions, 3%, per MLP step; callgrind).
  thread_local LaunchScratch scratch;
  std::vector<PJRT_Buffer*>& inputs = scratch.inputs;
  std::vector<PJRT_Buffer* const*>& input_lists = scratch.input_lists;
  inputs.assign(num_devices * num_args, nullptr);
  input_lists.assign(num_devices, nullptr);
  for (size_t d = 0; d < num_devices; ++d) {
    for (size_t i = 0; i < num_args; ++i) {
      const PjrtBuffer* pjrt_buffer = PjrtBuffer::Of(args[d][i]);
      if (pjrt_buffer == nullptr || pjrt_buffer->state() != state_.get()) {
        return absl::InvalidArgumentError("an input buffer was not made by this runtime");
      }
      inputs[d * num_args + i] = pjrt_buffer->handle();
    }
    input_lists[d] = inputs.data() + d * num_args;
  }
  const std::shared_ptr<const std::vector<int64_t>> keep =
      exe->NonDonated(options.donate_inputs, num_args);
  std::vector<PJRT_Buffer*>& outputs = scratch.outputs;
  std::vector<PJRT_Buffer**>& output_lists = scratch.output_lists;
  outputs.assign(num_devices * num_outputs, nullptr);
  output_lists.assign(num_devices, nullptr);
  for (size_t d = 0; d < num_devices; ++d) output_lists[d] = outputs.data() + d * num_outputs;
  std::vector<PJRT_Event*> done(num_devices, nullptr);

  PJRT_ARGS(PJRT_ExecuteOptions, execute_options);
  execute_options.non_donatable_input_indices = keep->data();
  execute_options.num_non_donatable_input_indices = keep->size();
  PJRT_ARGS(PJRT_LoadedExecutable_Execute_Args, execute);
  execute.executable = exe->handle();
  execute.options = &execute_options;
  execute.argument_lists = input_lists.data();
  execute.num_devices = num_devices;
  execute.num_args = num_args;
  execute.output_lists = output_lists.data();
  execute.device_complete_events = done.data();
  const absl::Time start = state_->clock->Now();
  if (absl::Status status = PJRT_CALL(api, PJRT_LoadedExecutable_Execute, execute); !status.ok()) {
    RETURN_IF_ERROR(CheckExecuteArgs(executable, args, options, state_->addressable,
                                     /*check_donation_state=*/true));
    return status;
  }
  {
    absl::MutexLock lock(&state_->mu);
    ++state_->counters.executions;
  }

  // Own every output and event first, so that nothing leaks on an error below.
  LaunchedExecution launched;
  launched.done = std::make_unique<PjrtExecution>(state_, std::move(done), start);
  launched.outputs.resize(num_devices);
  const std::shared_ptr<const std::vector<ArrayShape>>& shapes = exe->known_output_shapes();
  absl::Status status;
  for (size_t d = 0; d < num_devices; ++d) {
    launched.outputs[d].reserve(num_outputs);
    const int device = exe->device_indices()[d];
    for (size_t i = 0; i < num_outputs; ++i) {
      PJRT_Buffer* handle = outputs[d * num_outputs + i];
      if (shapes != nullptr) {
        launched.outputs[d].push_back(
            std::make_unique<PjrtBuffer>(state_, handle, shapes, i, device));
        continue;
      }
      absl::StatusOr<ArrayShape> shape = BufferShape(api, handle);
      if (status.ok()) status = shape.status();
      launched.outputs[d].push_back(std::make_unique<PjrtBuffer>(
          state_, handle, shape.ok() ? *std::move(shape) : ArrayShape{}, device));
    }
  }
  if (!status.ok()) {
    launched.done->Await().IgnoreError();  // nothing may run on after we dropped its outputs
    return status;
  }
  return launched;
}

absl::StatusOr<MemoryStats> PjrtRuntime::GetMemoryStats(absl::string_view runtime_name) {
  const PJRT_Api* api = state_->api;
  std::vector<std::string> names;
  for (size_t i = 0; i < state_->addressable.size(); ++i) {
    if (state_->addressable[i].runtime_name != runtime_name) {
      names.push_back(state_->addressable[i].runtime_name);
      continue;
    }
    MemoryStats stats{.runtime_name = std::string(runtime_name)};
    if (!PJRT_HAS(api, PJRT_Device_MemoryStats)) {
      stats.unreported_reason = "not reported by this plugin (no PJRT_Device_MemoryStats)";
      return stats;
    }
    PJRT_ARGS(PJRT_Device_MemoryStats_Args, args);
    args.device = state_->addressable_handles[i];
    absl::Status status = PJRT_CALL(api, PJRT_Device_MemoryStats, args);
    if (absl::IsUnimplemented(status)) {
      stats.unreported_reason = absl::StrCat("not reported by this plugin (", status.message(), ")");
      return stats;
    }
    RETURN_IF_ERROR(status);
    stats.bytes_in_use = args.bytes_in_use;
    std::vector<std::string> missing;
    if (args.peak_bytes_in_use_is_set) {
      stats.peak_bytes_in_use = args.peak_bytes_in_use;
    } else {
      missing.push_back("peak_bytes_in_use");
    }
    if (args.bytes_limit_is_set) {
      stats.bytes_limit = args.bytes_limit;
    } else {
      missing.push_back("bytes_limit");
    }
    if (!missing.empty()) {
      stats.unreported_reason =
          absl::StrCat(absl::StrJoin(missing, ", "), " not reported by this plugin");
    }
    return stats;
  }
  return absl::NotFoundError(absl::StrCat("no addressable device '", runtime_name,
                                          "'; devices: ", absl::StrJoin(names, ", ")));
}

RuntimeCounters PjrtRuntime::counters() const {
  absl::MutexLock lock(&state_->mu);
  return state_->counters;
}

}  // namespace meshrun::runtime
