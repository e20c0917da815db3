// Cross-host all-reduce of device buffers for multi-host CPU jobs: device -> host, HostAllReduce,
// host -> device. The mode-B step loop calls it between the `grad` and `apply` programs.
//
// Thread-safety: as HostAllReduce (one call at a time per HostAllReduce) and Runtime.
// Lifetime: nothing is kept; the returned buffers belong to the caller.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "worker/collectives/host_allreduce.h"
#include "worker/metrics.h"
#include "worker/runtime/runtime.h"

namespace meshrun::worker::collectives {

struct DeviceAllReduceOptions {
  ReduceOp op = ReduceOp::kMean;  // data-parallel gradients: the mean over hosts
  Metrics* metrics = nullptr;     // optional; see below
  Clock* clock = &RealClock();    // times the phases
};

// Reads every buffer to the host, all-reduces them across the ranks of `allreduce` (buffer i
// with the other ranks' buffer i, so every rank passes the same list: e.g. the `grad` outputs
// of each local device in execution order), and returns new buffers with the results on the
// same devices, in the same order; the inputs are left as they were.
//
// A replicated value (the same gradient on every local device) need only be passed once per
// host; the caller then copies it where it is needed.
//
// Metrics: TransferFromDeviceTime/Bytes and TransferToDeviceTime/Bytes per buffer,
// AllReduceTime and AllReduceBytes (f32 bytes reduced) once per call.
// Errors: INVALID_ARGUMENT (a buffer that is not f32, naming it; checked before any transfer,
// so the peers then time out in their all-reduce), the runtime's (transfers), the
// all-reduce's (HostAllReduce::AllReduce).
absl::StatusOr<std::vector<std::unique_ptr<runtime::DeviceBuffer>>> AllReduceDeviceBuffers(
    runtime::Runtime& runtime, HostAllReduce& allreduce,
    absl::Span<runtime::DeviceBuffer* const> buffers, const DeviceAllReduceOptions& options = {});

}  // namespace meshrun::worker::collectives
