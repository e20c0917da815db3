// Helpers shared by the files that implement StepLoop (step_loop*.cc); not part of its API.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "worker/step_loop.h"
#include "worker/telemetry_reducer.h"

namespace meshrun::worker {

// `status` with `prefix` before its message ("step 3: ..."), code kept.
inline absl::Status PrefixStatus(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

// StepLoop::Create's checks (step_loop_checks.cc), in the order it runs them.
// Errors: INVALID_ARGUMENT naming what is missing: the runtime, the executables the compile
// mode needs, the batch source, the clock.
absl::Status CheckConfigComplete(const StepLoop::Config& config, bool mode_b);
// Errors: INVALID_ARGUMENT for a step count, replica count or first step out of range.
absl::Status CheckStepRange(const RunSpec& spec);
// The programs against each other and the spec: mode B's accumulators out of grad and apply,
// the state count, one set of devices, the init program's seed. Errors: INVALID_ARGUMENT.
absl::Status CheckPrograms(const StepLoop::Config& config, bool mode_b);
// Each local device's mesh partition, from the job's device_ids (with device_partitions when
// they name only some devices; device order without them).
// Errors: INVALID_ARGUMENT when the mesh does not match the devices the step runs on.
absl::StatusOr<std::vector<int64_t>> PartitionsOf(
    const RunSpec& spec, const std::vector<int>& devices,
    const std::vector<runtime::DeviceDescription>& addressable);
// The batch inputs' shardings against the mesh and the batch program's signature. Errors:
// INVALID_ARGUMENT naming an unknown axis or the input counts.
absl::Status CheckBatchInputs(const RunSpec& spec, const runtime::Executable& batch_program,
                              int batch_offset, bool mode_b);
// The declared telemetry outputs as step output indices and reducer series. Errors:
// INVALID_ARGUMENT (no signature to name them, a name declared twice or not an output).
struct TelemetryOutputs {
  std::vector<int> index;
  std::vector<TelemetryReducer::Series> series;
};
absl::StatusOr<TelemetryOutputs> TelemetryOutputsOf(const RunSpec& spec,
                                                    const runtime::Executable& step);

}  // namespace meshrun::worker
