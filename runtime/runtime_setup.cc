#include "runtime/runtime_setup.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/backends.h"

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

}  // namespace

absl::StatusOr<std::unique_ptr<runtime::Runtime>> CreatePjrtRuntime(
    const std::string& plugin_path, int64_t cpu_devices,
    std::shared_ptr<runtime::KeyValueClient> kv_client) {
  runtime::RuntimeRegistry registry;
  RETURN_IF_ERROR(runtime::RegisterRuntimes(registry));
  if (kv_client != nullptr) kv_client = std::make_shared<PjrtKeyValueClient>(std::move(kv_client));
  return registry.Create("pjrt", {.plugin_path = plugin_path,
                                  .cpu_device_count = cpu_devices,
                                  .kv_client = std::move(kv_client)});
}

}  // namespace meshrun::services
