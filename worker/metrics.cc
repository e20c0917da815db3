#include "worker/metrics.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace meshrun::worker {
namespace {

absl::string_view KindName(MetricKind kind) {
  switch (kind) {
    case MetricKind::kTimer:
      return "timer";
    case MetricKind::kBytes:
      return "bytes";
    case MetricKind::kCounter:
      return "counter";
  }
  return "?";
}

std::string FormatSeconds(double seconds) {
  return absl::FormatDuration(absl::Seconds(seconds));
}

std::string FormatBytes(double bytes) {
  if (bytes >= 1024.0 * 1024.0 * 1024.0) {
    return absl::StrFormat("%.2fGB", bytes / (1024.0 * 1024.0 * 1024.0));
  }
  if (bytes >= 1024.0 * 1024.0) return absl::StrFormat("%.2fMB", bytes / (1024.0 * 1024.0));
  if (bytes >= 1024.0) return absl::StrFormat("%.2fKB", bytes / 1024.0);
  return absl::StrFormat("%.0fB", bytes);
}

}  // namespace

std::string MetricValue::unit() const {
  switch (kind) {
    case MetricKind::kTimer:
      return "seconds";
    case MetricKind::kBytes:
      return "bytes";
    case MetricKind::kCounter:
      return "";
  }
  return "";
}

void Metrics::AddTime(absl::string_view name, absl::Duration elapsed) {
  Record(name, MetricKind::kTimer, 1, absl::ToDoubleSeconds(elapsed));
}

void Metrics::AddBytes(absl::string_view name, int64_t bytes) {
  Record(name, MetricKind::kBytes, 1, static_cast<double>(bytes));
}

void Metrics::Increment(absl::string_view name, int64_t delta) {
  Record(name, MetricKind::kCounter, delta, static_cast<double>(delta));
}

void Metrics::Record(absl::string_view name, MetricKind kind, int64_t count, double sample) {
  absl::MutexLock l(&mu_);
  auto it = metrics_.find(name);
  if (it != metrics_.end() && it->second.kind != kind) {
    const std::string renamed = absl::StrCat(name, ".", KindName(kind));
    it = metrics_.find(renamed);
    if (it == metrics_.end()) {
      it = metrics_.emplace(renamed, MetricValue{.name = renamed, .kind = kind}).first;
    }
  } else if (it == metrics_.end()) {
    it = metrics_.emplace(std::string(name), MetricValue{.name = std::string(name), .kind = kind})
             .first;
  }
  MetricValue& m = it->second;
  if (kind != MetricKind::kCounter) {
    m.min = m.count == 0 ? sample : std::min(m.min, sample);
    m.max = m.count == 0 ? sample : std::max(m.max, sample);
  }
  m.count += count;
  m.total += sample;
}

std::vector<MetricValue> Metrics::Snapshot() const {
  absl::MutexLock l(&mu_);
  std::vector<MetricValue> out;
  out.reserve(metrics_.size());
  for (const auto& [name, value] : metrics_) out.push_back(value);
  return out;
}

MetricValue Metrics::Get(absl::string_view name) const {
  absl::MutexLock l(&mu_);
  auto it = metrics_.find(name);
  if (it == metrics_.end()) return MetricValue{.name = std::string(name)};
  return it->second;
}

std::string MetricsReport(const std::vector<MetricValue>& metrics) {
  std::string out;
  for (const MetricValue& m : metrics) {
    if (m.kind == MetricKind::kCounter) {
      absl::StrAppend(&out, "Counter: ", m.name, "\n  Value: ", m.count, "\n");
      continue;
    }
    const auto format = m.kind == MetricKind::kTimer ? FormatSeconds : FormatBytes;
    const double mean = m.count == 0 ? 0 : m.total / static_cast<double>(m.count);
    absl::StrAppend(&out, "Metric: ", m.name, "\n  TotalSamples: ", m.count,
                    "\n  Accumulator: ", format(m.total), "\n  Mean: ", format(mean),
                    "\n  Min/Max: ", format(m.min), " / ", format(m.max), "\n");
  }
  return out;
}

}  // namespace meshrun::worker
