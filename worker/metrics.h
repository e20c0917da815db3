// A worker's metrics registry in the style of torch_xla's metrics report: named timers
// (CompileTime, ExecuteTime, ...), byte meters (TransferToDeviceBytes, ...) and counters
// (Steps, CacheHits). Each metric keeps a sample count and a total, the shape of
// meshrun.v1.Metric, so a service adapter maps a snapshot to protos one to one.
//
// Thread-safety: every method is safe to call concurrently. Lifetime: plain object; whoever
// records into it (a StepLoop, the worker service) must not outlive it.
// Errors: none; recording never fails.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace meshrun::worker {

// Metric names shared by the step loop and the worker service.
inline constexpr char kCompileTime[] = "CompileTime";            // timer
inline constexpr char kLoadTime[] = "LoadTime";                  // timer (DeserializeAndLoad)
inline constexpr char kExecuteTime[] = "ExecuteTime";            // timer (every Execute)
inline constexpr char kStepTime[] = "StepTime";                  // timer (one training step)
inline constexpr char kDataWaitTime[] = "DataWaitTime";  // timer (a step waiting for its batch)
inline constexpr char kTransferToDeviceTime[] = "TransferToDeviceTime";      // timer
inline constexpr char kTransferToDeviceBytes[] = "TransferToDeviceBytes";    // bytes; count = transfers
inline constexpr char kTransferFromDeviceTime[] = "TransferFromDeviceTime";  // timer
inline constexpr char kTransferFromDeviceBytes[] = "TransferFromDeviceBytes";  // bytes; count = transfers
inline constexpr char kTelemetryReduceTime[] = "TelemetryReduceTime";  // timer (on-device reduce + read)
inline constexpr char kTelemetrySinkTime[] = "TelemetrySinkTime";  // timer (the sink callback)
inline constexpr char kAllReduceTime[] = "AllReduceTime";  // timer (cross-host gradient all-reduce)
inline constexpr char kAllReduceBytes[] = "AllReduceBytes";  // bytes reduced; count = all-reduces
inline constexpr char kCheckpointBlockingTime[] = "CheckpointBlockingTime";  // timer (loop waits)
inline constexpr char kCheckpointWriteTime[] = "CheckpointWriteTime";  // timer (writer thread)
inline constexpr char kCheckpointBytes[] = "CheckpointBytes";  // bytes written; count = checkpoints
inline constexpr char kCheckpointFailures[] = "CheckpointFailures";  // counter
inline constexpr char kMemoryCheckpointTime[] = "MemoryCheckpointTime";  // timer (loop waits)
inline constexpr char kMemoryCheckpointBytes[] = "MemoryCheckpointBytes";  // bytes held; count = copies
inline constexpr char kSteps[] = "Steps";                        // counter
inline constexpr char kTelemetryReads[] = "TelemetryReads";      // counter (one per logging step)
inline constexpr char kCacheHits[] = "CacheHits";                // counter (executable cache)

enum class MetricKind { kTimer, kBytes, kCounter };

struct MetricValue {
  std::string name;
  MetricKind kind = MetricKind::kCounter;
  int64_t count = 0;  // samples (timers, bytes) or the counter's value
  double total = 0;   // seconds (timers), bytes (bytes), the counter's value (counters)
  double min = 0;     // smallest sample; 0 for counters
  double max = 0;     // largest sample; 0 for counters
  // "seconds", "bytes" or "" (the unit field of meshrun.v1.Metric).
  std::string unit() const;
};

class Metrics {
 public:
  Metrics() = default;
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // Each name keeps the kind it was first recorded with; recording a name with another kind
  // records it under "<name>.<kind>" instead, so nothing is silently merged.
  void AddTime(absl::string_view name, absl::Duration elapsed);
  void AddBytes(absl::string_view name, int64_t bytes);
  void Increment(absl::string_view name, int64_t delta = 1);

  // Every metric, sorted by name.
  std::vector<MetricValue> Snapshot() const;
  // A value by name; a metric never recorded is returned with count 0 and total 0.
  MetricValue Get(absl::string_view name) const;

 private:
  void Record(absl::string_view name, MetricKind kind, int64_t count, double sample);

  mutable absl::Mutex mu_;
  std::map<std::string, MetricValue, std::less<>> metrics_ ABSL_GUARDED_BY(mu_);
};

// torch_xla-style text:
//   Metric: ExecuteTime
//     TotalSamples: 20
//     Accumulator: 12.345ms
//     Mean: 617.25us
//     Min/Max: 580us / 802us
//   Counter: Steps
//     Value: 20
std::string MetricsReport(const std::vector<MetricValue>& metrics);

}  // namespace meshrun::worker
