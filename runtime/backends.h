// Explicit registration of the runtime backends this build contains (CMake options):
//   "pjrt"  any PJRT plugin through the PJRT C API   (MESHRUN_WITH_PJRT, default ON)
// Thread-safety: call RegisterRuntimes at start-up; the registry itself is thread-safe.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "runtime/runtime.h"

namespace meshrun::runtime {

// Errors: ALREADY_EXISTS when called twice on one registry.
absl::Status RegisterRuntimes(RuntimeRegistry& registry);

// The CPU plugin that scripts/setup.sh fetches (CMake cache var MESHRUN_PJRT_PLUGIN): the
// default plugin of tests, benchmarks and the worker's --pjrt_plugin flag.
std::string DefaultPjrtPluginPath();

// The libtpu that scripts/setup.sh fetches (CMake cache var MESHRUN_TPU_PLUGIN), the one paired
// with the project's JAX: the default compiler of `meshrun compile` and the TPU tests.
std::string DefaultTpuCompilerPluginPath();

}  // namespace meshrun::runtime
