// Creating the PJRT runtime of a meshrun process (coordinator to compile, worker to run).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/runtime.h"

namespace meshrun::services {

// `cpu_devices` sets the CPU plugin's device count; other plugins ignore it.
// Errors: the runtime's (a missing or wrong plugin path is named in the message).
absl::StatusOr<std::unique_ptr<runtime::Runtime>> CreatePjrtRuntime(
    const std::string& plugin_path, int64_t cpu_devices,
    std::shared_ptr<runtime::KeyValueClient> kv_client = nullptr);

}  // namespace meshrun::services
