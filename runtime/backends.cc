#include "runtime/backends.h"

#include "common/status_macros.h"
#if MESHRUN_WITH_PJRT
#include "runtime/pjrt/pjrt_runtime.h"
#endif

namespace meshrun::runtime {

absl::Status RegisterRuntimes(RuntimeRegistry& registry) {
#if MESHRUN_WITH_PJRT
  RETURN_IF_ERROR(registry.Register(
      "pjrt", [](const RuntimeConfig& config) -> absl::StatusOr<std::unique_ptr<Runtime>> {
        ASSIGN_OR_RETURN(std::unique_ptr<PjrtRuntime> runtime, PjrtRuntime::Create(config));
        return std::unique_ptr<Runtime>(std::move(runtime));
      }));
#endif
  return absl::OkStatus();
}

std::string DefaultPjrtPluginPath() { return MESHRUN_DEFAULT_PJRT_PLUGIN; }
std::string DefaultTpuCompilerPluginPath() { return MESHRUN_DEFAULT_TPU_PLUGIN; }

}  // namespace meshrun::runtime
