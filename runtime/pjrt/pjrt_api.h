// The PJRT C API as meshrun's PJRT backend calls it: argument and feature macros, errors and
// events, dtypes, plugins and the key-value callbacks a client is created with. Internal to
// runtime/pjrt/.
//
// Plugins are loaded once per process and path (dlopen + GetPjrtApi) and never unloaded.
// Thread-safety: LoadPlugin is safe to call concurrently; the rest are pure functions or, for
// the callbacks, as safe as the KeyValueClient they are given.
#pragma once

#include <cstddef>
#include <cstring>
#include <map>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/runtime.h"
#include "xla/pjrt/c/pjrt_c_api.h"

// True when the plugin's function table is long enough to hold `fn` and fills it. A plugin
// built against an older header has a shorter table.
#define PJRT_HAS(api, fn) \
  (offsetof(PJRT_Api, fn) + sizeof(void*) <= (api)->struct_size && (api)->fn != nullptr)

// Zeroed C API arguments whose struct_size is this header's size, so the plugin knows which
// fields we know about.
#define PJRT_ARGS(type, name) \
  type name;                  \
  std::memset(&name, 0, sizeof(name)); \
  name.struct_size = type##_STRUCT_SIZE

// Calls `fn` with `args` and converts its error, named after the function.
#define PJRT_CALL(api, fn, args) \
  ::meshrun::runtime::pjrt::ErrorToStatus((api), (api)->fn(&(args)), #fn)

namespace meshrun::runtime::pjrt {

// A loaded plugin: its API table, file digest and PJRT_Plugin_Attributes as strings.
struct Plugin {
  std::string path;
  const PJRT_Api* api = nullptr;
  std::string sha256;
  std::map<std::string, std::string> attributes;
};

// The plugin at `path` (resolved), loaded and initialized on first use. Errors: as
// PjrtRuntime::Create (pjrt_runtime.h) for a path that is missing, not a plugin, of another C
// API major version, or lacking a required function.
absl::StatusOr<const Plugin*> LoadPlugin(const std::string& path);

// `error` (destroyed here) as a status prefixed with `call`; OK for null. PJRT's error codes are
// absl's.
absl::Status ErrorToStatus(const PJRT_Api* api, PJRT_Error* error, absl::string_view call);
// Waits for `event` and destroys it; OK for null. Its error is prefixed with `what`.
absl::Status AwaitEvent(const PJRT_Api* api, PJRT_Event* event, absl::string_view what);

PJRT_Buffer_Type ToPjrt(DType dtype);    // PJRT_Buffer_Type_INVALID when PJRT has no such type
DType FromPjrt(PJRT_Buffer_Type type);   // DType::kInvalid when meshrun has no such type
std::string NamedValueToString(const PJRT_NamedValue& value);  // "[1,2]" for an int64 list

// One device as meshrun describes it; local_id is -1 (a client's addressable list sets it).
// `platform` names the runtime_name ("TPU:3", "cpu:5").
absl::StatusOr<DeviceDescription> DescribeDevice(const PJRT_Api* api,
                                                 PJRT_DeviceDescription* description,
                                                 const std::string& platform);

// The optimized program of `executable` (PJRT_Executable_OptimizedProgram: its bytes and
// format, e.g. a serialized HloModuleProtoWithConfig and "hlo"); std::nullopt when the plugin
// cannot hand it back.
struct OptimizedProgram {
  std::string code;
  std::string format;
};
std::optional<OptimizedProgram> GetOptimizedProgram(const PJRT_Api* api,
                                                    PJRT_Executable* executable);

// Client-create callbacks over the KeyValueClient given as their user_arg.
PJRT_Error* KvGet(PJRT_KeyValueGetCallback_Args* args);
PJRT_Error* KvTryGet(PJRT_KeyValueTryGetCallback_Args* args);
PJRT_Error* KvPut(PJRT_KeyValuePutCallback_Args* args);

}  // namespace meshrun::runtime::pjrt
