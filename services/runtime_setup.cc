#include "services/runtime_setup.h"

#include "common/status_macros.h"
#include "worker/runtime/backends.h"

namespace meshrun::services {

absl::StatusOr<std::unique_ptr<runtime::Runtime>> CreatePjrtRuntime(
    const std::string& plugin_path, int64_t cpu_devices,
    std::shared_ptr<runtime::KeyValueClient> kv_client) {
  runtime::RuntimeRegistry registry;
  RETURN_IF_ERROR(runtime::RegisterRuntimes(registry));
  return registry.Create("pjrt", {.plugin_path = plugin_path,
                                  .cpu_device_count = cpu_devices,
                                  .kv_client = std::move(kv_client)});
}

}  // namespace meshrun::services
