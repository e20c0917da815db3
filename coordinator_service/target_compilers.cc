#include "coordinator_service/target_compilers.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/runtime_setup.h"

namespace meshrun::services {

absl::StatusOr<std::shared_ptr<runtime::TargetCompiler>> TargetCompilers::ForHosts(
    const std::vector<coordinator::WorkerInfo>& hosts, int num_slices) {
  if (hosts.empty() || hosts.front().devices.empty()) {
    return absl::FailedPreconditionError("the job's hosts list no devices");
  }
  const int slices = std::max(num_slices, 1);
  const int devices_per_host = static_cast<int>(hosts.front().devices.size());
  absl::StatusOr<runtime::CompileTarget> target = runtime::TargetForHosts(
      hosts.front().devices.front().kind, static_cast<int>(hosts.size()) / slices,
      devices_per_host, slices);
  if (!target.ok()) return absl::FailedPreconditionError(target.status().message());
  std::shared_ptr<runtime::TargetCompiler> compiler;
  {
    absl::MutexLock lock(&mu_);
    auto it = compilers_.find(target->name);
    if (it != compilers_.end()) compiler = it->second;
  }
  if (compiler == nullptr) {
    // Outside the lock: building a topology loads libtpu the first time (seconds).
    absl::StatusOr<std::unique_ptr<runtime::TargetCompiler>> created =
        CreateTargetCompiler(plugin_path_, *target);
    if (!created.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("--tpu_compiler_plugin cannot compile for ", target->name, ": ",
                       created.status().message()));
    }
    spdlog::info("compiler for {} ready: topology {}, {}", target->name, target->topology_name,
                 runtime::ToString((*created)->identity()));
    absl::MutexLock lock(&mu_);
    compiler = compilers_.try_emplace(target->name, std::move(*created)).first->second;
  }
  const runtime::RuntimeIdentity& theirs = hosts.front().runtime;
  if (compiler->identity().plugin_sha256 != theirs.plugin_sha256) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--tpu_compiler_plugin is another libtpu (", runtime::ToString(compiler->identity()),
        ") than the workers' (", runtime::ToString(theirs), ")"));
  }
  return compiler;
}

}  // namespace meshrun::services
