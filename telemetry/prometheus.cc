#include "telemetry/prometheus.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace meshrun::telemetry {
namespace {

bool ValidName(const std::string& name, bool allow_colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' ||
                    (allow_colon && c == ':') ||
                    (i > 0 && absl::ascii_isdigit(static_cast<unsigned char>(c)));
    if (!ok) return false;
  }
  return true;
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter: return "counter";
    case MetricType::kHistogram: return "histogram";
    case MetricType::kGauge: break;
  }
  return "gauge";
}

constexpr const char* kHistogramSuffixes[] = {"_bucket", "_sum", "_count"};

std::string Escape(const std::string& text, bool quote) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (quote && c == '"') {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  if (value == std::floor(value) && std::fabs(value) < 1e15) return absl::StrFormat("%.0f", value);
  // The shortest form that reads back as the same double.
  for (int precision = 15; precision < 17; ++precision) {
    std::string text = absl::StrFormat("%.*g", precision, value);
    if (std::strtod(text.c_str(), nullptr) == value) return text;
  }
  return absl::StrFormat("%.17g", value);
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  for (size_t i = 0; i < bounds_.size(); ++i) {
    if (!std::isfinite(bounds_[i]) || (i > 0 && bounds_[i] <= bounds_[i - 1])) {
      std::fprintf(stderr, "Histogram: upper bounds must be finite and increasing\n");
      std::abort();
    }
  }
}

void Histogram::Observe(double value) {
  size_t bucket = bounds_.size();  // +Inf, and NaN
  if (!std::isnan(value)) {
    bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  }
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_.size());
  uint64_t total = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) out[i] = total += counts_[i];
  return out;
}

bool IsValidMetricName(const std::string& name) { return ValidName(name, true); }
bool IsValidLabelName(const std::string& name) { return ValidName(name, false); }

absl::Status PrometheusText::Declare(const std::string& name, MetricType type,
                                     const std::string& help) {
  if (!IsValidMetricName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("metric name \"", name, "\" is not legal"));
  }
  if (type == MetricType::kCounter && !absl::EndsWith(name, "_total")) {
    return absl::InvalidArgumentError(absl::StrCat("counter ", name, " must end in _total"));
  }
  if (type == MetricType::kHistogram) {
    for (const char* suffix : kHistogramSuffixes) {
      if (absl::EndsWith(name, suffix)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "histogram ", name, " must not end in ", suffix, " (its samples' suffix)"));
      }
    }
  }
  auto it = families_.find(name);
  if (it != families_.end()) {
    if (it->second.type != type) {
      return absl::InvalidArgumentError(absl::StrCat(name, " is already a ",
                                                     TypeName(it->second.type)));
    }
    return absl::OkStatus();
  }
  families_.emplace(name, Family{type, help, {}});
  order_.push_back(name);
  return absl::OkStatus();
}

absl::StatusOr<std::string> PrometheusText::RenderLabels(const std::string& name,
                                                          const Labels& labels,
                                                          const std::string& extra) const {
  if (labels.empty() && extra.empty()) return std::string();
  std::set<std::string> seen;
  std::string out = "{";
  for (size_t i = 0; i < labels.size(); ++i) {
    const auto& [label, label_value] = labels[i];
    if (!IsValidLabelName(label) || absl::StartsWith(label, "__")) {
      return absl::InvalidArgumentError(absl::StrCat("label name \"", label, "\" of ", name,
                                                     " is not legal"));
    }
    if (!seen.insert(label).second) {
      return absl::InvalidArgumentError(absl::StrCat("label ", label, " of ", name,
                                                     " is repeated"));
    }
    absl::StrAppend(&out, i ? "," : "", label, "=\"", Escape(label_value, true), "\"");
  }
  absl::StrAppend(&out, !labels.empty() && !extra.empty() ? "," : "", extra, "}");
  return out;
}

absl::Status PrometheusText::Add(const std::string& name, const Labels& labels, double value) {
  auto it = families_.find(name);
  if (it == families_.end()) {
    return absl::InvalidArgumentError(absl::StrCat("metric ", name, " is not declared"));
  }
  if (it->second.type == MetricType::kHistogram) {
    return absl::InvalidArgumentError(absl::StrCat(name, " is a histogram: use AddHistogram"));
  }
  absl::StatusOr<std::string> rendered = RenderLabels(name, labels);
  if (!rendered.ok()) return rendered.status();
  const std::string series = name + *rendered;
  if (!series_.emplace(series, true).second) {
    return absl::InvalidArgumentError(absl::StrCat("series ", series, " is added twice"));
  }
  it->second.lines.push_back(absl::StrCat(series, " ", FormatValue(value)));
  return absl::OkStatus();
}

absl::Status PrometheusText::AddHistogram(const std::string& name, const Labels& labels,
                                          const Histogram& histogram) {
  auto it = families_.find(name);
  if (it == families_.end() || it->second.type != MetricType::kHistogram) {
    return absl::InvalidArgumentError(absl::StrCat("histogram ", name, " is not declared"));
  }
  for (const auto& label : labels) {
    if (label.first == "le") {
      return absl::InvalidArgumentError(absl::StrCat("histogram ", name,
                                                     " must not carry its own le label"));
    }
  }
  absl::StatusOr<std::string> plain = RenderLabels(name, labels);
  if (!plain.ok()) return plain.status();
  if (!series_.emplace(name + *plain, true).second) {
    return absl::InvalidArgumentError(absl::StrCat("series ", name, *plain, " is added twice"));
  }
  std::vector<std::string>& lines = it->second.lines;
  const std::vector<uint64_t> cumulative = histogram.CumulativeCounts();
  for (size_t i = 0; i <= cumulative.size(); ++i) {
    const bool inf = i == cumulative.size();
    absl::StatusOr<std::string> with_le = RenderLabels(
        name, labels,
        absl::StrCat("le=\"", inf ? "+Inf" : FormatValue(histogram.upper_bounds()[i]), "\""));
    if (!with_le.ok()) return with_le.status();
    lines.push_back(absl::StrCat(name, "_bucket", *with_le, " ",
                                 inf ? histogram.count() : cumulative[i]));
  }
  lines.push_back(absl::StrCat(name, "_sum", *plain, " ", FormatValue(histogram.sum())));
  lines.push_back(absl::StrCat(name, "_count", *plain, " ", histogram.count()));
  return absl::OkStatus();
}

std::string PrometheusText::Render() const {
  std::string out;
  for (const std::string& name : order_) {
    const Family& family = families_.at(name);
    absl::StrAppend(&out, "# HELP ", name, " ", Escape(family.help, false), "\n", "# TYPE ",
                    name, " ", TypeName(family.type), "\n");
    for (const std::string& line : family.lines) absl::StrAppend(&out, line, "\n");
  }
  return out;
}

namespace {

// Parses `name{labels} value [timestamp]` into its series key; errors say what is wrong.
absl::Status ParseSample(const std::string& line, std::string* name, std::string* series,
                         bool* has_le) {
  size_t i = 0;
  while (i < line.size() && line[i] != '{' && line[i] != ' ') ++i;
  *name = line.substr(0, i);
  if (!IsValidMetricName(*name)) return absl::InvalidArgumentError("illegal metric name");
  std::set<std::string> labels;
  std::string canonical;
  if (i < line.size() && line[i] == '{') {
    ++i;
    while (true) {
      if (i >= line.size()) return absl::InvalidArgumentError("unterminated label set");
      if (line[i] == '}') {
        ++i;
        break;
      }
      size_t start = i;
      while (i < line.size() && line[i] != '=') ++i;
      const std::string label = line.substr(start, i - start);
      if (!IsValidLabelName(label)) {
        return absl::InvalidArgumentError(absl::StrCat("illegal label name \"", label, "\""));
      }
      if (!labels.insert(label).second) {
        return absl::InvalidArgumentError(absl::StrCat("label ", label, " repeated"));
      }
      if (++i >= line.size() || line[i] != '"') {
        return absl::InvalidArgumentError(absl::StrCat("label ", label, " value not quoted"));
      }
      std::string value;
      for (++i;; ++i) {
        if (i >= line.size()) return absl::InvalidArgumentError("unterminated label value");
        if (line[i] == '"') break;
        if (line[i] == '\\') {
          if (++i >= line.size() || (line[i] != '\\' && line[i] != '"' && line[i] != 'n')) {
            return absl::InvalidArgumentError("bad escape in label value");
          }
        }
        value += line[i];
      }
      ++i;  // past the closing quote
      absl::StrAppend(&canonical, label, "=", value, "\x1f");
      if (i < line.size() && line[i] == ',') ++i;
      else if (i >= line.size() || line[i] != '}') {
        return absl::InvalidArgumentError("expected , or } after a label");
      }
    }
  }
  if (i >= line.size() || line[i] != ' ') return absl::InvalidArgumentError("no value");
  std::vector<std::string> rest = absl::StrSplit(line.substr(i + 1), ' ');
  if (rest.empty() || rest.size() > 2) return absl::InvalidArgumentError("expected value [ts]");
  const std::string& value = rest[0];
  if (value != "NaN" && value != "+Inf" && value != "-Inf") {
    char* end = nullptr;
    std::strtod(value.c_str(), &end);
    if (value.empty() || *end != '\0' ||
        absl::ascii_isalpha(static_cast<unsigned char>(value[0]))) {
      return absl::InvalidArgumentError(absl::StrCat("bad value \"", value, "\""));
    }
  }
  if (rest.size() == 2) {
    char* end = nullptr;
    std::strtoll(rest[1].c_str(), &end, 10);
    if (rest[1].empty() || *end != '\0') return absl::InvalidArgumentError("bad timestamp");
  }
  *series = *name + "\x1e" + canonical;
  *has_le = labels.count("le") > 0;
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckExposition(const std::string& text) {
  if (text.empty()) return absl::OkStatus();
  if (text.back() != '\n') return absl::InvalidArgumentError("exposition must end in a newline");
  std::vector<std::string> lines = absl::StrSplit(text.substr(0, text.size() - 1), '\n');
  std::set<std::string> families, series;
  std::string current;  // family of the last TYPE line
  std::string current_type;
  std::set<std::string> helped;
  for (size_t n = 0; n < lines.size(); ++n) {
    const std::string& line = lines[n];
    auto fail = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat("line ", n + 1, " (", line, "): ", why));
    };
    if (absl::StartsWith(line, "# HELP ") || absl::StartsWith(line, "# TYPE ")) {
      std::vector<std::string> parts = absl::StrSplit(line.substr(7), absl::MaxSplits(' ', 1));
      if (parts.size() != 2 || !IsValidMetricName(parts[0])) return fail("illegal family name");
      if (line[2] == 'H') {
        if (!helped.insert(parts[0]).second) return fail("HELP repeated");
        for (size_t i = 0; i < parts[1].size(); ++i) {
          if (parts[1][i] == '\\' &&
              (i + 1 >= parts[1].size() || (parts[1][i + 1] != '\\' && parts[1][i + 1] != 'n'))) {
            return fail("bad escape in HELP");
          }
          if (parts[1][i] == '\\') ++i;
        }
        continue;
      }
      if (parts[1] != "gauge" && parts[1] != "counter" && parts[1] != "histogram") {
        return fail("unknown TYPE");
      }
      if (!families.insert(parts[0]).second) return fail("family declared twice");
      if (parts[1] == "counter" && !absl::EndsWith(parts[0], "_total")) {
        return fail("counter name must end in _total");
      }
      current = parts[0];
      current_type = parts[1];
      continue;
    }
    if (line.empty() || line[0] == '#') return fail("blank line or stray comment");
    std::string name, key;
    bool has_le = false;
    if (absl::Status s = ParseSample(line, &name, &key, &has_le); !s.ok()) {
      return fail(std::string(s.message()));
    }
    if (current_type == "histogram") {
      if (name == current + "_bucket") {
        if (!has_le) return fail("histogram bucket without an le label");
      } else if (name != current + "_sum" && name != current + "_count") {
        return fail("sample outside its histogram's _bucket, _sum and _count");
      }
    } else if (name != current) {
      return fail("sample outside its family's TYPE block");
    }
    if (!series.insert(key).second) return fail("duplicate series");
  }
  return absl::OkStatus();
}

}  // namespace meshrun::telemetry
