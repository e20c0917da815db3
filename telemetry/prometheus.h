// Prometheus text exposition (format 0.0.4): a writer that only produces valid output, and a
// strict checker for tests and tools.
//
// The writer groups samples by family (one HELP and one TYPE line each, families in the order
// first declared), escapes label values and HELP text, and refuses what would make the
// exposition invalid: illegal metric or label names, a sample of an undeclared family, a
// family declared twice with another type, a series (name + label set) added twice.
//
// A histogram family renders as Prometheus' classic histogram: per series, cumulative
// `<name>_bucket{...,le="<bound>"}` samples ending in le="+Inf", then `<name>_sum` and
// `<name>_count`.
//
// Lifetime: plain value types. Thread-safety: not thread-safe; build one PrometheusText per
// scrape, and guard a Histogram that several threads observe.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace meshrun::telemetry {

enum class MetricType { kGauge, kCounter, kHistogram };

using Labels = std::vector<std::pair<std::string, std::string>>;  // name, value; in order

// Observations counted into fixed buckets (upper bounds, inclusive), with their sum.
class Histogram {
 public:
  // `upper_bounds`: finite and strictly increasing (the +Inf bucket is implicit); a program
  // error otherwise, so callers pass constants (kStepTimeBuckets).
  explicit Histogram(std::vector<double> upper_bounds);

  // Counts `value` in the first bucket whose bound is >= it (NaN only in +Inf and the count).
  void Observe(double value);

  const std::vector<double>& upper_bounds() const { return bounds_; }
  // Cumulative counts, one per upper bound (the +Inf bucket is count()).
  std::vector<uint64_t> CumulativeCounts() const;
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; the last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Buckets for training step times, in seconds: a CPU test step (milliseconds) to a large TPU
// step (a minute).
inline const std::vector<double>& StepTimeBuckets() {
  static const std::vector<double> buckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                              0.25,  0.5,    1,     2.5,  5,     10,   30, 60};
  return buckets;
}

class PrometheusText {
 public:
  // Declares a family. A counter's name must end in "_total". Declaring the same name again
  // with the same type is a no-op. Errors: INVALID_ARGUMENT (illegal name, counter without
  // _total, name declared with another type).
  absl::Status Declare(const std::string& name, MetricType type, const std::string& help);

  // Adds one sample of a gauge or counter. Errors: INVALID_ARGUMENT (family not declared or a
  // histogram, illegal or repeated label name, series already added — each named).
  absl::Status Add(const std::string& name, const Labels& labels, double value);

  // Adds one series of a histogram family: its buckets, sum and count. Errors: as Add, and
  // INVALID_ARGUMENT when the family is not a histogram or `labels` holds "le".
  absl::Status AddHistogram(const std::string& name, const Labels& labels,
                            const Histogram& histogram);

  // The exposition text, ending in a newline (empty when nothing was declared).
  std::string Render() const;

 private:
  struct Family {
    MetricType type;
    std::string help;
    std::vector<std::string> lines;  // rendered samples
  };
  std::vector<std::string> order_;
  std::map<std::string, Family> families_;
  std::map<std::string, bool> series_;  // rendered name{labels}, for duplicate checks

  // Checks `labels` and renders them as {a="x",b="y"} (empty for none); `extra` is appended
  // unchecked (a histogram's le).
  absl::StatusOr<std::string> RenderLabels(const std::string& name, const Labels& labels,
                                           const std::string& extra = "") const;
};

// True for names matching [a-zA-Z_:][a-zA-Z0-9_:]* (metric) or [a-zA-Z_][a-zA-Z0-9_]* (label).
bool IsValidMetricName(const std::string& name);
bool IsValidLabelName(const std::string& name);

// Checks a whole exposition strictly: every line is a HELP, TYPE or sample line (no other
// comments, no blank lines); names and label names are legal; label values are correctly
// escaped and quoted; values parse; every sample belongs to the family whose TYPE precedes it
// (counters end in _total; a histogram's samples are <name>_bucket with an le label, <name>_sum
// and <name>_count); families are contiguous and declared once; no series repeats.
// Errors: INVALID_ARGUMENT naming the line number and what is wrong.
absl::Status CheckExposition(const std::string& text);

}  // namespace meshrun::telemetry
