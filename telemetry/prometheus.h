// Prometheus text exposition (format 0.0.4): a writer that only produces valid output, and a
// strict checker for tests and tools.
//
// The writer groups samples by family (one HELP and one TYPE line each, families in the order
// first declared), escapes label values and HELP text, and refuses what would make the
// exposition invalid: illegal metric or label names, a sample of an undeclared family, a
// family declared twice with another type, a series (name + label set) added twice.
//
// Lifetime: plain value type. Thread-safety: not thread-safe; build one per scrape.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace meshrun::telemetry {

enum class MetricType { kGauge, kCounter };

using Labels = std::vector<std::pair<std::string, std::string>>;  // name, value; in order

class PrometheusText {
 public:
  // Declares a family. A counter's name must end in "_total". Declaring the same name again
  // with the same type is a no-op. Errors: INVALID_ARGUMENT (illegal name, counter without
  // _total, name declared with another type).
  absl::Status Declare(const std::string& name, MetricType type, const std::string& help);

  // Adds one sample. Errors: INVALID_ARGUMENT (family not declared, illegal or repeated label
  // name, series already added — each named).
  absl::Status Add(const std::string& name, const Labels& labels, double value);

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
};

// True for names matching [a-zA-Z_:][a-zA-Z0-9_:]* (metric) or [a-zA-Z_][a-zA-Z0-9_]* (label).
bool IsValidMetricName(const std::string& name);
bool IsValidLabelName(const std::string& name);

// Checks a whole exposition strictly: every line is a HELP, TYPE or sample line (no other
// comments, no blank lines); names and label names are legal; label values are correctly
// escaped and quoted; values parse; every sample belongs to the family whose TYPE precedes it
// (counters end in _total); families are contiguous and declared once; no series repeats.
// Errors: INVALID_ARGUMENT naming the line number and what is wrong.
absl::Status CheckExposition(const std::string& text);

}  // namespace meshrun::telemetry
