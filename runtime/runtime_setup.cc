#include "runtime/runtime_setup.h"

#include <stdlib.h>

#include <filesystem>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/backends.h"
#if MESHRUN_WITH_PJRT
#include "runtime/pjrt/pjrt_target_compiler.h"
#endif

namespace meshrun::services {
namespace {

// The PJRT client's keys live under "pjrt/": the coordinator lets any worker of the cluster
// use that namespace, and keeps collectives/<job>/ for the job's members (job_membership.h).
class PjrtKeyValueClient final : public runtime::KeyValueClient {
 public:
  explicit PjrtKeyValueClient(std::shared_ptr<runtime::KeyValueClient> store)
      : store_(std::move(store)) {}
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override {
    return store_->Get(Key(key), timeout);
  }
  absl::StatusOr<std::string> TryGet(absl::string_view key) override {
    return store_->TryGet(Key(key));
  }
  absl::Status Set(absl::string_view key, absl::string_view value) override {
    return store_->Set(Key(key), value);
  }
  absl::Status Delete(absl::string_view key) override { return store_->Delete(Key(key)); }

 private:
  static std::string Key(absl::string_view key) { return absl::StrCat("pjrt/", key); }
  const std::shared_ptr<runtime::KeyValueClient> store_;
};

// libtpu's answers when the host has no TPU chips (seen with libtpu 0.0.30 and 0.0.51).
bool NoTpuChips(const absl::Status& status) {
  return absl::StrContains(status.message(), "No jellyfish device found") ||
         absl::StrContains(status.message(), "Failed to get global TPU topology") ||
         absl::StrContains(status.message(), "TPU initialization failed");
}

}  // namespace

PluginPlatform PluginPlatformOf(const std::string& plugin_path) {
  const std::string name =
      absl::AsciiStrToLower(std::filesystem::path(plugin_path).filename().string());
  if (absl::StartsWith(name, "libtpu")) return PluginPlatform::kTpu;
  if (absl::StrContains(name, "cuda") || absl::StrContains(name, "gpu")) {
    return PluginPlatform::kCuda;
  }
  if (absl::StrContains(name, "cpu")) return PluginPlatform::kCpu;
  return PluginPlatform::kOther;
}

std::map<std::string, runtime::CreateOptionValue> DefaultCreateOptions(PluginPlatform platform,
                                                                      int64_t cpu_devices) {
  switch (platform) {
    case PluginPlatform::kCpu:
      return {{"cpu_device_count", cpu_devices}};
    case PluginPlatform::kCuda:
      return {{"platform_name", std::string("cuda")}, {"allocator", std::string("default")}};
    case PluginPlatform::kTpu:
    case PluginPlatform::kOther:
      return {};
  }
  return {};
}

absl::StatusOr<std::unique_ptr<runtime::Runtime>> CreatePjrtRuntime(
    const std::string& plugin_path, int64_t cpu_devices,
    std::shared_ptr<runtime::KeyValueClient> kv_client) {
  runtime::RuntimeRegistry registry;
  RETURN_IF_ERROR(runtime::RegisterRuntimes(registry));
  if (kv_client != nullptr) kv_client = std::make_shared<PjrtKeyValueClient>(std::move(kv_client));
  const PluginPlatform platform = PluginPlatformOf(plugin_path);
  absl::StatusOr<std::unique_ptr<runtime::Runtime>> runtime =
      registry.Create("pjrt", {.plugin_path = plugin_path,
                               .create_options = DefaultCreateOptions(platform, cpu_devices),
                               .kv_client = std::move(kv_client)});
  if (!runtime.ok() && platform == PluginPlatform::kTpu &&
      absl::StrContains(runtime.status().message(), "libtpu multi-process lockfile")) {
    return absl::FailedPreconditionError(absl::StrCat(
        "another process on this host holds libtpu (", runtime.status().message(),
        "): stop the other worker or JAX process using the TPU chips, then start again"));
  }
  if (!runtime.ok() && platform == PluginPlatform::kTpu && NoTpuChips(runtime.status())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "libtpu found no TPU chips on this host (", runtime.status().message(),
        "): run the worker on a TPU VM, or give --pjrt_plugin the CPU plugin to run on CPU"));
  }
  return runtime;
}

absl::StatusOr<std::unique_ptr<runtime::TargetCompiler>> CreateTargetCompiler(
    const std::string& plugin_path, const runtime::CompileTarget& target) {
#if MESHRUN_WITH_PJRT
  // Compiling for a topology needs nothing of this host: libtpu must neither spend minutes
  // asking a metadata server for the host's TPU variables nor take the host's chip lock
  // (/tmp/libtpu_lockfile), which a worker or a second compiler would then be refused. The
  // environment still wins.
  if (PluginPlatformOf(plugin_path) == PluginPlatform::kTpu) {
    setenv("TPU_SKIP_MDS_QUERY", "1", 0);
    setenv("ALLOW_MULTIPLE_LIBTPU_LOAD", "1", 0);
  }
  return runtime::CreatePjrtTargetCompiler(plugin_path, target);
#else
  return absl::UnimplementedError("this build has no PJRT backend (MESHRUN_WITH_PJRT=OFF)");
#endif
}

}  // namespace meshrun::services
