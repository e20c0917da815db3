// Compiling for a target rather than for the machine: a TargetCompiler builds programs for a
// TPU topology (compile_target.h) through a plugin that can (libtpu: PJRT_TopologyDescription_
// Create + PJRT_Compile), with no client and no device, so a CPU-only coordinator or a laptop
// compiles for slices it does not have. The serialized executable loads on a host of that
// target whose runtime identity() equals this compiler's identity().
//
// Create one with CreateTargetCompiler (runtime_setup.h).
// Thread-safety: Compile may be called concurrently. Lifetime: the plugin stays loaded for the
// process; the topology lives as long as the compiler.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/compile_target.h"
#include "runtime/identity.h"
#include "runtime/runtime.h"

namespace meshrun::runtime {

struct TargetExecutable {
  std::string serialized;     // what Runtime::DeserializeAndLoad takes on the target
  ExecutableStats stats;
  std::string optimized_hlo;  // the optimized HloModuleProto, serialized; empty when not given
  absl::Duration compile_time;
};

class TargetCompiler {
 public:
  virtual ~TargetCompiler() = default;
  virtual const CompileTarget& target() const = 0;
  // As a runtime on a host of the target reports it: platform "tpu", the plugin's version and
  // file digest. Part of every cache key of what this compiler builds.
  virtual const RuntimeIdentity& identity() const = 0;
  // The topology's devices (global ids, process index per host, coords).
  virtual const std::vector<DeviceDescription>& devices() const = 0;

  // Errors: as Runtime::Compile (INVALID_ARGUMENT for a program the compiler rejects, with its
  // message); UNIMPLEMENTED when the plugin cannot serialize.
  virtual absl::StatusOr<TargetExecutable> Compile(const ProgramSource& program) = 0;
};

}  // namespace meshrun::runtime
