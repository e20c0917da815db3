#include "telemetry/combine.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace meshrun::telemetry {

absl::StatusOr<Combine> ParseCombine(absl::string_view name) {
  if (name == "mean") return Combine::kMean;
  if (name == "max") return Combine::kMax;
  if (name == "min") return Combine::kMin;
  if (name == "sum") return Combine::kSum;
  if (name == "last") return Combine::kLast;
  return absl::InvalidArgumentError(
      absl::StrCat("combine \"", name, "\" is unknown; use mean, max, min, sum or last"));
}

std::string CombineName(Combine combine) {
  switch (combine) {
    case Combine::kMean: return "mean";
    case Combine::kMax: return "max";
    case Combine::kMin: return "min";
    case Combine::kSum: return "sum";
    case Combine::kLast: return "last";
  }
  return "unknown";
}

absl::StatusOr<std::vector<float>> CombineValues(Combine combine,
                                                 absl::Span<const HostValues> hosts) {
  if (hosts.empty()) return absl::InvalidArgumentError("no host values to combine");
  const size_t size = hosts.front().values.size();
  for (const HostValues& host : hosts) {
    if (host.values.size() != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host ", host.host_index, " sent ", host.values.size(), " values where host ",
          hosts.front().host_index, " sent ", size, "; every host must send the declared shape"));
    }
    if (host.replica_count < 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "host ", host.host_index, " has replica_count ", host.replica_count, "; must be >= 1"));
    }
  }
  if (combine == Combine::kLast) {
    return std::max_element(hosts.begin(), hosts.end(),
                            [](const HostValues& a, const HostValues& b) {
                              return a.host_index < b.host_index;
                            })
        ->values;
  }
  std::vector<double> acc(hosts.front().values.begin(), hosts.front().values.end());
  double weight = hosts.front().replica_count;
  if (combine == Combine::kMean) {
    for (double& v : acc) v *= weight;
  }
  for (size_t h = 1; h < hosts.size(); ++h) {
    const HostValues& host = hosts[h];
    for (size_t i = 0; i < size; ++i) {
      const double v = host.values[i];
      switch (combine) {
        case Combine::kMean: acc[i] += v * host.replica_count; break;
        case Combine::kMax: acc[i] = std::max(acc[i], v); break;
        case Combine::kMin: acc[i] = std::min(acc[i], v); break;
        case Combine::kSum: acc[i] += v; break;
        case Combine::kLast: break;
      }
    }
    weight += host.replica_count;
  }
  std::vector<float> out(size);
  for (size_t i = 0; i < size; ++i) {
    out[i] = static_cast<float>(combine == Combine::kMean ? acc[i] / weight : acc[i]);
  }
  return out;
}

}  // namespace meshrun::telemetry
