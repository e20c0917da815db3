// Creating the PJRT runtime of a meshrun process (coordinator to compile, worker to run).
#pragma once

#include <cstdint>
#include <memory>
#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/compile_target.h"
#include "runtime/runtime.h"
#include "runtime/target_compiler.h"

namespace meshrun::services {

// Which platform a plugin file serves, by its name as the packages ship it: libtpu*.so is
// TPU, *cuda*/*gpu* CUDA, *cpu* CPU; kOther when the name says none (it gets no options).
enum class PluginPlatform { kCpu, kTpu, kCuda, kOther };
PluginPlatform PluginPlatformOf(const std::string& plugin_path);

// The client-create options each plugin gets, as JAX gives them: CPU cpu_device_count; CUDA
// platform_name "cuda" and allocator "default"; TPU none (libtpu reads its environment).
std::map<std::string, runtime::CreateOptionValue> DefaultCreateOptions(PluginPlatform platform,
                                                                      int64_t cpu_devices);

// A runtime over the plugin at `plugin_path` with DefaultCreateOptions. `cpu_devices` sets the
// CPU plugin's device count; other plugins never see it.
// Errors: the runtime's (a missing or wrong plugin path is named in the message). A TPU plugin
// that finds no TPU chips is FAILED_PRECONDITION, naming the cause and the fix.
absl::StatusOr<std::unique_ptr<runtime::Runtime>> CreatePjrtRuntime(
    const std::string& plugin_path, int64_t cpu_devices,
    std::shared_ptr<runtime::KeyValueClient> kv_client = nullptr);

// A compiler for `target` through the plugin at `plugin_path` (target_compiler.h).
// Errors: UNIMPLEMENTED (no PJRT backend in this build, or a plugin that cannot compile for a
// topology), then the plugin's.
absl::StatusOr<std::unique_ptr<runtime::TargetCompiler>> CreateTargetCompiler(
    const std::string& plugin_path, const runtime::CompileTarget& target);

}  // namespace meshrun::services
