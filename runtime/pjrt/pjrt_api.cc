// The PJRT C API as the PJRT backend calls it (pjrt_api.h).
#include "runtime/pjrt/pjrt_api.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <climits>
#include <cstddef>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace meshrun::runtime::pjrt {
namespace {

struct DTypeMapping {
  DType dtype;
  PJRT_Buffer_Type pjrt;
};
constexpr DTypeMapping kDTypeMappings[] = {
    {DType::kPred, PJRT_Buffer_Type_PRED}, {DType::kS8, PJRT_Buffer_Type_S8},
    {DType::kS16, PJRT_Buffer_Type_S16},   {DType::kS32, PJRT_Buffer_Type_S32},
    {DType::kS64, PJRT_Buffer_Type_S64},   {DType::kU8, PJRT_Buffer_Type_U8},
    {DType::kU16, PJRT_Buffer_Type_U16},   {DType::kU32, PJRT_Buffer_Type_U32},
    {DType::kU64, PJRT_Buffer_Type_U64},   {DType::kF16, PJRT_Buffer_Type_F16},
    {DType::kBF16, PJRT_Buffer_Type_BF16}, {DType::kF32, PJRT_Buffer_Type_F32},
    {DType::kF64, PJRT_Buffer_Type_F64},
};

std::map<std::string, std::string> NamedValues(const PJRT_NamedValue* values, size_t n) {
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < n; ++i) {
    out[std::string(values[i].name, values[i].name_size)] = NamedValueToString(values[i]);
  }
  return out;
}

// Functions meshrun cannot work without; everything else is checked with PJRT_HAS at use.
#define PJRT_REQUIRED(fn) {offsetof(PJRT_Api, fn), #fn}
constexpr std::pair<size_t, const char*> kRequired[] = {
    PJRT_REQUIRED(PJRT_Error_Destroy),
    PJRT_REQUIRED(PJRT_Error_Message),
    PJRT_REQUIRED(PJRT_Error_GetCode),
    PJRT_REQUIRED(PJRT_Event_Destroy),
    PJRT_REQUIRED(PJRT_Event_Await),
    PJRT_REQUIRED(PJRT_Client_Create),
    PJRT_REQUIRED(PJRT_Client_Destroy),
    PJRT_REQUIRED(PJRT_Client_PlatformName),
    PJRT_REQUIRED(PJRT_Client_PlatformVersion),
    PJRT_REQUIRED(PJRT_Client_Devices),
    PJRT_REQUIRED(PJRT_Client_AddressableDevices),
    PJRT_REQUIRED(PJRT_Client_Compile),
    PJRT_REQUIRED(PJRT_Client_BufferFromHostBuffer),
    PJRT_REQUIRED(PJRT_DeviceDescription_Id),
    PJRT_REQUIRED(PJRT_DeviceDescription_ProcessIndex),
    PJRT_REQUIRED(PJRT_DeviceDescription_Kind),
    PJRT_REQUIRED(PJRT_DeviceDescription_Attributes),
    PJRT_REQUIRED(PJRT_Device_GetDescription),
    PJRT_REQUIRED(PJRT_Device_IsAddressable),
    PJRT_REQUIRED(PJRT_Executable_Destroy),
    PJRT_REQUIRED(PJRT_Executable_NumOutputs),
    PJRT_REQUIRED(PJRT_LoadedExecutable_Destroy),
    PJRT_REQUIRED(PJRT_LoadedExecutable_GetExecutable),
    PJRT_REQUIRED(PJRT_LoadedExecutable_AddressableDevices),
    PJRT_REQUIRED(PJRT_LoadedExecutable_Execute),
    PJRT_REQUIRED(PJRT_Buffer_Destroy),
    PJRT_REQUIRED(PJRT_Buffer_ElementType),
    PJRT_REQUIRED(PJRT_Buffer_Dimensions),
    PJRT_REQUIRED(PJRT_Buffer_IsDeleted),
    PJRT_REQUIRED(PJRT_Buffer_ToHostBuffer),
    PJRT_REQUIRED(PJRT_Buffer_ReadyEvent),
};

absl::StatusOr<std::unique_ptr<Plugin>> OpenPlugin(const std::string& path) {
  auto plugin = std::make_unique<Plugin>();
  plugin->path = path;
  // RTLD_LOCAL: two plugins (or a plugin and JAX's own XLA) must not resolve each other's symbols.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load PJRT plugin ", path, ": ", dlerror()));
  }
  using GetPjrtApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetPjrtApiFn>(dlsym(handle, "GetPjrtApi"));
  if (get_api == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " is not a PJRT plugin: it exports no GetPjrtApi"));
  }
  const PJRT_Api* api = get_api();
  if (api == nullptr) return absl::InternalError(absl::StrCat(path, ": GetPjrtApi returned null"));
  const int major = api->pjrt_api_version.major_version;
  const int minor = api->pjrt_api_version.minor_version;
  if (major != PJRT_API_MAJOR) {
    return absl::FailedPreconditionError(absl::StrCat(
        "PJRT plugin ", path, " implements C API ", major, ".", minor, ", meshrun was built with ",
        PJRT_API_MAJOR, ".", PJRT_API_MINOR, ": the major versions must match"));
  }
  std::vector<std::string> missing;
  for (const auto& [offset, name] : kRequired) {
    const bool present = offset + sizeof(void*) <= api->struct_size &&
                         *reinterpret_cast<void* const*>(
                             reinterpret_cast<const char*>(api) + offset) != nullptr;
    if (!present) missing.push_back(name);
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("PJRT plugin ", path, " (C API ", major, ".",
                                                      minor, ") lacks ",
                                                      absl::StrJoin(missing, ", ")));
  }
  plugin->api = api;
  if (PJRT_HAS(api, PJRT_Plugin_Attributes)) {
    PJRT_ARGS(PJRT_Plugin_Attributes_Args, attributes);
    RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Plugin_Attributes, attributes));
    plugin->attributes = NamedValues(attributes.attributes, attributes.num_attributes);
  }
  if (PJRT_HAS(api, PJRT_Plugin_Initialize)) {
    PJRT_ARGS(PJRT_Plugin_Initialize_Args, init);
    RETURN_IF_ERROR(PJRT_CALL(api, PJRT_Plugin_Initialize, init));
  }
  ASSIGN_OR_RETURN(plugin->sha256, Sha256File(path));
  return plugin;
}

PJRT_Error* CallbackError(PJRT_CallbackError* make_error, const absl::Status& status) {
  const std::string message(status.message());
  return (*make_error)(static_cast<PJRT_Error_Code>(status.code()), message.data(),
                       message.size());
}

void DeleteValue(char* value) { delete[] value; }

// Hands a get callback's value (a copy the plugin frees with DeleteValue) or its error back.
template <typename Args>
PJRT_Error* ReturnValue(Args* args, const absl::StatusOr<std::string>& value) {
  if (!value.ok()) return CallbackError(args->callback_error, value.status());
  args->value = new char[value->size()];
  std::memcpy(args->value, value->data(), value->size());
  args->value_size = value->size();
  args->value_deleter_callback = DeleteValue;
  return nullptr;
}

}  // namespace

absl::Status ErrorToStatus(const PJRT_Api* api, PJRT_Error* error, absl::string_view call) {
  if (error == nullptr) return absl::OkStatus();
  PJRT_ARGS(PJRT_Error_Message_Args, message);
  message.error = error;
  api->PJRT_Error_Message(&message);
  PJRT_ARGS(PJRT_Error_GetCode_Args, code);
  code.error = error;
  PJRT_Error* code_error = api->PJRT_Error_GetCode(&code);
  // PJRT_Error_Code uses absl's numbering.
  const auto status_code = code_error == nullptr ? static_cast<absl::StatusCode>(code.code)
                                                 : absl::StatusCode::kUnknown;
  absl::Status status(status_code, absl::StrCat(call, ": ",
                                                absl::string_view(message.message,
                                                                  message.message_size)));
  PJRT_ARGS(PJRT_Error_Destroy_Args, destroy);
  destroy.error = error;
  api->PJRT_Error_Destroy(&destroy);
  if (code_error != nullptr) {
    destroy.error = code_error;
    api->PJRT_Error_Destroy(&destroy);
  }
  return status;
}

absl::Status AwaitEvent(const PJRT_Api* api, PJRT_Event* event, absl::string_view what) {
  if (event == nullptr) return absl::OkStatus();
  PJRT_ARGS(PJRT_Event_Await_Args, await);
  await.event = event;
  absl::Status status = ErrorToStatus(api, api->PJRT_Event_Await(&await), what);
  PJRT_ARGS(PJRT_Event_Destroy_Args, destroy);
  destroy.event = event;
  api->PJRT_Event_Destroy(&destroy);
  return status;
}

PJRT_Buffer_Type ToPjrt(DType dtype) {
  for (const DTypeMapping& m : kDTypeMappings) {
    if (m.dtype == dtype) return m.pjrt;
  }
  return PJRT_Buffer_Type_INVALID;
}

DType FromPjrt(PJRT_Buffer_Type type) {
  for (const DTypeMapping& m : kDTypeMappings) {
    if (m.pjrt == type) return m.dtype;
  }
  return DType::kInvalid;
}

std::string NamedValueToString(const PJRT_NamedValue& value) {
  switch (value.type) {
    case PJRT_NamedValue_kString:
      return std::string(value.string_value, value.value_size);
    case PJRT_NamedValue_kInt64:
      return absl::StrCat(value.int64_value);
    case PJRT_NamedValue_kInt64List:
      return absl::StrCat(
          "[",
          absl::StrJoin(absl::MakeConstSpan(value.int64_array_value, value.value_size), ","),
          "]");
    case PJRT_NamedValue_kFloat:
      return absl::StrCat(value.float_value);
    case PJRT_NamedValue_kBool:
      return value.bool_value ? "true" : "false";
  }
  return "?";
}

absl::StatusOr<const Plugin*> LoadPlugin(const std::string& path) {
  if (path.empty()) return absl::InvalidArgumentError("no PJRT plugin path given");
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::NotFoundError(absl::StrCat(
        "PJRT plugin not found: ", path,
        " (scripts/setup.sh fetches the CPU plugin; on TPU hosts give libtpu.so's path)"));
  }
  char resolved[PATH_MAX];
  const std::string key = realpath(path.c_str(), resolved) != nullptr ? resolved : path;
  static absl::Mutex mu(absl::kConstInit);
  static auto* plugins = new std::map<std::string, std::unique_ptr<Plugin>>();
  absl::MutexLock lock(&mu);
  auto it = plugins->find(key);
  if (it == plugins->end()) {
    ASSIGN_OR_RETURN(std::unique_ptr<Plugin> plugin, OpenPlugin(path));
    it = plugins->emplace(key, std::move(plugin)).first;
  }
  return it->second.get();
}

absl::StatusOr<DeviceDescription> DescribeDevice(const PJRT_Api* api,
                                                 PJRT_DeviceDescription* description,
                                                 const std::string& platform) {
  DeviceDescription out;
  PJRT_ARGS(PJRT_DeviceDescription_Id_Args, id);
  id.device_description = description;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_DeviceDescription_Id, id));
  out.global_id = id.id;
  out.local_id = -1;
  PJRT_ARGS(PJRT_DeviceDescription_ProcessIndex_Args, process);
  process.device_description = description;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_DeviceDescription_ProcessIndex, process));
  out.process_index = process.process_index;
  PJRT_ARGS(PJRT_DeviceDescription_Kind_Args, kind);
  kind.device_description = description;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_DeviceDescription_Kind, kind));
  out.kind.assign(kind.device_kind, kind.device_kind_size);
  PJRT_ARGS(PJRT_DeviceDescription_Attributes_Args, attributes);
  attributes.device_description = description;
  RETURN_IF_ERROR(PJRT_CALL(api, PJRT_DeviceDescription_Attributes, attributes));
  for (size_t i = 0; i < attributes.num_attributes; ++i) {
    const PJRT_NamedValue& value = attributes.attributes[i];
    const std::string name(value.name, value.name_size);
    out.attributes[name] = NamedValueToString(value);
    if (name == "coords" && value.type == PJRT_NamedValue_kInt64List) {
      out.coords.assign(value.int64_array_value, value.int64_array_value + value.value_size);
    }
  }
  // The names torch_xla and the seeds use: "TPU:3" on TPU, "<platform>:<id>" elsewhere.
  out.runtime_name = absl::StrCat(platform == "tpu" ? "TPU" : platform, ":", out.global_id);
  return out;
}

std::optional<OptimizedProgram> GetOptimizedProgram(const PJRT_Api* api,
                                                    PJRT_Executable* executable) {
  if (!PJRT_HAS(api, PJRT_Executable_OptimizedProgram)) return std::nullopt;
  PJRT_ARGS(PJRT_Program, program);
  PJRT_ARGS(PJRT_Executable_OptimizedProgram_Args, args);
  args.executable = executable;
  args.program = &program;
  if (!PJRT_CALL(api, PJRT_Executable_OptimizedProgram, args).ok()) return std::nullopt;
  OptimizedProgram out{.code = std::string(program.code_size, '\0')};
  program.code = out.code.data();
  if (!PJRT_CALL(api, PJRT_Executable_OptimizedProgram, args).ok()) return std::nullopt;
  if (program.format != nullptr) out.format.assign(program.format, program.format_size);
  return out;
}

PJRT_Error* KvGet(PJRT_KeyValueGetCallback_Args* args) {
  auto* kv = static_cast<KeyValueClient*>(args->user_arg);
  return ReturnValue(args, kv->Get(absl::string_view(args->key, args->key_size),
                                   absl::Milliseconds(args->timeout_in_ms)));
}

PJRT_Error* KvTryGet(PJRT_KeyValueTryGetCallback_Args* args) {
  auto* kv = static_cast<KeyValueClient*>(args->user_arg);
  return ReturnValue(args, kv->TryGet(absl::string_view(args->key, args->key_size)));
}

PJRT_Error* KvPut(PJRT_KeyValuePutCallback_Args* args) {
  auto* kv = static_cast<KeyValueClient*>(args->user_arg);
  absl::Status status = kv->Set(absl::string_view(args->key, args->key_size),
                                absl::string_view(args->value, args->value_size));
  return status.ok() ? nullptr : CallbackError(args->callback_error, status);
}

}  // namespace meshrun::runtime::pjrt
