// Combine semantics: how the hosts' values of one telemetry output become the global value.
//
// Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace meshrun::telemetry {

enum class Combine { kMean, kMax, kMin, kSum, kLast };

// Accepts "mean", "max", "min", "sum", "last".
// Errors: INVALID_ARGUMENT naming the value and the accepted ones.
absl::StatusOr<Combine> ParseCombine(absl::string_view name);
std::string CombineName(Combine combine);

// One host's fixed-shape values of one output at one step.
struct HostValues {
  int host_index = 0;     // order of hosts in the job; kLast takes the highest that reported
  int replica_count = 1;  // weight for kMean
  std::vector<float> values;
};

// Combines element-wise. kMean is weighted by replica_count; it accumulates in double so
// that many hosts do not lose precision.
// Errors: INVALID_ARGUMENT when `hosts` is empty, shapes differ, or a replica count is < 1.
absl::StatusOr<std::vector<float>> CombineValues(Combine combine,
                                                 absl::Span<const HostValues> hosts);

}  // namespace meshrun::telemetry
