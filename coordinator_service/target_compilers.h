// The TPU compilers a coordinator holds (runtime/target_compiler.h): with
// --tpu_compiler_plugin=<libtpu.so>, a coordinator on a CPU-only node compiles a TPU job's
// programs for the slice its workers form and ships the serialized executable, as it does for
// its own runtime. One compiler per target, created on first use and kept.
//
// Thread-safety: ForHosts may be called concurrently. Lifetime: compilers live as long as this.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "coordinator/worker_registry.h"
#include "runtime/target_compiler.h"

namespace meshrun::services {

class TargetCompilers {
 public:
  explicit TargetCompilers(std::string plugin_path) : plugin_path_(std::move(plugin_path)) {}

  // The compiler for the slice(s) `hosts` form (all of one device kind and count; `num_slices`
  // from the plan), when it builds what those hosts run: its libtpu is theirs (same plugin
  // sha256). Errors: FAILED_PRECONDITION naming why this coordinator cannot compile for them
  // (no target for that device kind or slice shape, another libtpu, a plugin that cannot
  // compile for a topology): the job then compiles on its first worker.
  absl::StatusOr<std::shared_ptr<runtime::TargetCompiler>> ForHosts(
      const std::vector<coordinator::WorkerInfo>& hosts, int num_slices);

 private:
  const std::string plugin_path_;
  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<runtime::TargetCompiler>> compilers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun::services
