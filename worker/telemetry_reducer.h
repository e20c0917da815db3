// Reduces a step's declared telemetry outputs on device into one f32 vector.
//
// Telemetry (choice): a TelemetryReducer compiles a small StableHLO program, written as MLIR
// text by the loop itself from the declared outputs' per-device shapes. It converts each output
// to f32, combines it across the local devices with the declared combine, evaluates thresholds
// into flags, and concatenates everything into one f32[K] vector; the loop copies that vector
// from one device with a single ToHost. Non-logging steps make no device-to-host transfer.
// Across-device semantics: an output whose sharding names no mesh axis (replicated) is the same
// on every device, so its value is device 0's copy (no collective: `sum` of a replicated loss is
// the loss, not devices x loss). An output sharded over mesh axes is combined element-wise over
// the distinct shards this host holds (one representative device per shard, found from the mesh
// coordinates), with an all_gather across the local devices; its shape is the per-device shard
// shape. `last` takes the representative with the highest mesh partition. The combine across
// HOSTS is the coordinator's (telemetry/combine.h), weighted by replica_count.
// Threshold flag: set when some element of the combined value is not <= threshold (NaN trips
// it); computed on device, the host only reads it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "telemetry/combine.h"
#include "worker/metrics.h"
#include "runtime/runtime.h"

namespace meshrun::worker {

// One telemetry series' value at one step on this host.
struct TelemetryValue {
  std::string name;
  std::vector<int64_t> shape;
  std::vector<float> values;  // row-major
  bool threshold_exceeded = false;
};

// Reduces declared telemetry outputs on device into one f32 vector (see the file comment).
// Thread-safety: Reduce may be called from one thread at a time. Lifetime: borrows the Runtime
// and Metrics, which must outlive it.
class TelemetryReducer {
 public:
  struct Series {
    std::string name;
    runtime::ArrayShape shape;  // per device, as the step program returns it
    telemetry::Combine combine = telemetry::Combine::kMean;
    std::optional<double> threshold;
    std::vector<std::string> sharding;  // empty = replicated
  };
  struct Config {
    runtime::Runtime* runtime = nullptr;
    // The step's devices (indices into runtime->addressable_devices()) and the mesh partition
    // each runs, in the step executable's order.
    std::vector<int> device_indices;
    std::vector<int64_t> partitions;
    std::vector<std::string> mesh_axes;
    std::vector<int64_t> mesh_shape;
    std::vector<Series> series;
    Metrics* metrics = nullptr;  // receives CompileTime, ExecuteTime, TransferFromDevice*
    Clock* clock = &RealClock();
  };

  // Writes and compiles the reduction program.
  // Errors: INVALID_ARGUMENT (no series; a series with no elements, an unsupported dtype, a NaN
  // threshold, or a sharding naming an unknown axis or longer than the shape; partitions not
  // matching devices); the runtime's Compile errors.
  static absl::StatusOr<std::unique_ptr<TelemetryReducer>> Create(Config config);

  // per_device[d][i]: series i's buffer on config.device_indices[d]. Runs the program and makes
  // exactly one device-to-host transfer.
  // Errors: INVALID_ARGUMENT (wrong number of devices or buffers); the runtime's Execute / ToHost
  // errors.
  absl::StatusOr<std::vector<TelemetryValue>> Reduce(
      absl::Span<const std::vector<runtime::DeviceBuffer*>> per_device);

  const std::string& program() const { return program_; }  // the MLIR text
  int num_replicas() const { return static_cast<int>(positions_.size()); }
  int64_t output_elements() const { return output_elements_; }

 private:
  explicit TelemetryReducer(Config config) : config_(std::move(config)) {}

  Config config_;
  std::string program_;
  std::unique_ptr<runtime::Executable> executable_;
  std::vector<int> positions_;  // executable device order -> position in config.device_indices
  int64_t output_elements_ = 0;
};

}  // namespace meshrun::worker
