// The PJRT backend of TargetCompiler (target_compiler.h): a PJRT_TopologyDescription of the
// target, built by the plugin without a client, and PJRT_Compile against it. Internal to
// runtime/; callers use CreateTargetCompiler (runtime_setup.h).
//
// Thread-safety: as TargetCompiler. Lifetime: owns its topology; the plugin is never unloaded.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/target_compiler.h"

struct PJRT_Api;
struct PJRT_Executable;

namespace meshrun::runtime {

// Errors: as PjrtRuntime::Create for the plugin; UNIMPLEMENTED when the plugin cannot build
// topologies or compile for them (the CPU plugin: compile on a host instead); the plugin's own
// from PJRT_TopologyDescription_Create, prefixed with the target.
absl::StatusOr<std::unique_ptr<TargetCompiler>> CreatePjrtTargetCompiler(
    const std::string& plugin_path, const CompileTarget& target);

namespace pjrt {
// The compiler's analysis of `executable`: memory per device, cost analysis and fingerprint,
// each where the plugin reports it (what it does not is named in `unreported`).
ExecutableStats ReadExecutableStats(const PJRT_Api* api, PJRT_Executable* executable);
}  // namespace pjrt

}  // namespace meshrun::runtime
