// Cross-host all-reduce of device buffers for multi-host CPU jobs: device -> host, HostAllReduce,
// host -> device. The mode-B step loop calls it between the `grad` and `apply` programs
// (AllReduceInPlace fits StepLoop::Config::reduce_gradients).
//
// Thread-safety: as HostAllReduce (one call at a time per HostAllReduce) and Runtime.
// Lifetime: nothing is kept; the buffers returned or put in place belong to the caller.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "worker/collectives/host_allreduce.h"
#include "worker/metrics.h"
#include "runtime/runtime.h"

namespace meshrun::worker::collectives {

struct DeviceAllReduceOptions {
  ReduceOp op = ReduceOp::kMean;  // data-parallel gradients: the mean over hosts
  // AllReduceInPlace: every local device holds the same values (data-parallel gradients of
  // replicated parameters), so only device 0's copies cross hosts and the result is uploaded
  // to every device.
  bool replicated_across_devices = false;
  Metrics* metrics = nullptr;  // optional; see below
  Clock* clock = &RealClock();  // times the phases
};

// Reads every buffer to the host, all-reduces them across the ranks of `allreduce` (buffer i
// with the other ranks' buffer i, so every rank passes the same list), and returns new buffers
// with the results on the same devices, in the same order; the inputs are left as they were.
//
// Metrics: TransferFromDeviceTime/Bytes and TransferToDeviceTime/Bytes per buffer,
// AllReduceTime and AllReduceBytes (f32 bytes reduced) once per call.
// Errors: INVALID_ARGUMENT (a buffer that is not f32, naming it; checked before any transfer,
// so the peers then time out in their all-reduce), the runtime's (transfers), the
// all-reduce's (HostAllReduce::AllReduce).
absl::StatusOr<std::vector<std::unique_ptr<runtime::DeviceBuffer>>> AllReduceDeviceBuffers(
    runtime::Runtime& runtime, HostAllReduce& allreduce,
    absl::Span<runtime::DeviceBuffer* const> buffers, const DeviceAllReduceOptions& options = {});

// buffers[device][array], e.g. a mode-B step's gradient accumulators: replaces every buffer
// with its all-reduced value (same shape, same device). Nothing is replaced unless all
// succeed. Without replicated_across_devices each device's arrays are reduced with the same
// device's arrays on the other ranks.
// Errors: as AllReduceDeviceBuffers; INVALID_ARGUMENT when replicated_across_devices is set
// and the devices hold different numbers or shapes of arrays.
using PerDeviceBuffers = std::vector<std::vector<std::unique_ptr<runtime::DeviceBuffer>>>;
absl::Status AllReduceInPlace(runtime::Runtime& runtime, HostAllReduce& allreduce,
                              PerDeviceBuffers& buffers,
                              const DeviceAllReduceOptions& options = {});

}  // namespace meshrun::worker::collectives
