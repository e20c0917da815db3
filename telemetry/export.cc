#include "telemetry/export.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace meshrun::telemetry {
namespace {

// "i/j/..." of row-major element `flat` in `shape`; empty for a scalar.
std::string ElementIndex(const google::protobuf::RepeatedField<int64_t>& shape, int64_t flat) {
  if (shape.empty()) return "";
  std::vector<int64_t> index(shape.size());
  for (int d = shape.size() - 1; d >= 0; --d) {
    const int64_t dim = std::max<int64_t>(shape[d], 1);
    index[d] = flat % dim;
    flat /= dim;
  }
  return absl::StrJoin(index, "/");
}

// Enough digits for a float to read back as the same float.
std::string FloatText(float v) { return absl::StrFormat("%.9g", v); }

std::string JsonString(absl::string_view s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Series names are identifiers declared by the job; quote one anyway if it needs it (RFC 4180).
std::string CsvField(const std::string& s) {
  if (s.find_first_of(",\"\r\n") == std::string::npos) return s;
  return absl::StrCat("\"", absl::StrReplaceAll(s, {{"\"", "\"\""}}), "\"");
}

// Protocol buffer wire format, the few pieces an Event needs.
void PutVarint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7f) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
template <typename T>
void PutFixed(std::string& out, T v) {  // little-endian, as the wire format wants
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out.append(bytes, sizeof(T));
}
void PutBytesField(std::string& out, int field, absl::string_view bytes) {
  PutVarint(out, (field << 3) | 2);
  PutVarint(out, bytes.size());
  out.append(bytes.data(), bytes.size());
}

// Event {1: double wall_time, 2: int64 step, 3: string file_version, 5: Summary summary}.
std::string EventPrefix(double wall_time, int64_t step) {
  std::string event;
  PutVarint(event, (1 << 3) | 1);
  PutFixed<double>(event, wall_time);
  if (step != 0) {
    PutVarint(event, 2 << 3);
    PutVarint(event, static_cast<uint64_t>(step));
  }
  return event;
}

// Summary.Value {1: string tag, 2: float simple_value}.
void PutScalar(std::string& summary, absl::string_view tag, float value) {
  std::string v;
  PutBytesField(v, 1, tag);
  PutVarint(v, (2 << 3) | 5);
  PutFixed<float>(v, value);
  PutBytesField(summary, 1, v);  // Summary {1: repeated Value value}
}

const std::array<uint32_t, 256>& Crc32cTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

}  // namespace

absl::StatusOr<ExportFormat> ParseExportFormat(absl::string_view name) {
  if (name == "csv") return ExportFormat::kCsv;
  if (name == "jsonl") return ExportFormat::kJsonl;
  if (name == "tensorboard") return ExportFormat::kTensorBoard;
  return absl::InvalidArgumentError(absl::StrCat(
      "--format=\"", name, "\" is not an export format; use one of: csv, jsonl, tensorboard"));
}

std::string CsvHeader() {
  return "step,wall_time_unix_micros,series,element,index,value,partial\n";
}

std::string CsvRows(const v1::GlobalSummary& summary) {
  std::string out;
  for (const v1::TelemetryValue& v : summary.values()) {
    for (int i = 0; i < v.values_size(); ++i) {
      absl::StrAppend(&out, summary.step(), ",", summary.wall_time_unix_micros(), ",",
                      CsvField(v.name()), ",", i, ",",
                      ElementIndex(v.shape(), i), ",", FloatText(v.values(i)), ",",
                      summary.partial() ? "true" : "false", "\n");
    }
  }
  return out;
}

std::string JsonLine(const v1::GlobalSummary& summary) {
  std::vector<std::string> missing;
  for (const std::string& host : summary.missing_hosts()) missing.push_back(JsonString(host));
  std::vector<std::string> series;
  for (const v1::TelemetryValue& v : summary.values()) {
    std::vector<std::string> values;
    for (float x : v.values()) values.push_back(std::isfinite(x) ? FloatText(x) : "null");
    series.push_back(absl::StrCat(JsonString(v.name()), ":{\"shape\":[",
                                  absl::StrJoin(v.shape(), ","), "],\"values\":[",
                                  absl::StrJoin(values, ","), "]}"));
  }
  return absl::StrCat(
      "{\"step\":", summary.step(), ",\"wall_time_unix_micros\":", summary.wall_time_unix_micros(),
      ",\"step_time_seconds\":", absl::StrFormat("%.9g", summary.step_time_seconds()),
      ",\"partial\":", summary.partial() ? "true" : "false", ",\"missing_hosts\":[",
      absl::StrJoin(missing, ","), "],\"synthetic_data\":",
      summary.synthetic_data() ? "true" : "false", ",\"values\":{", absl::StrJoin(series, ","),
      "}}\n");
}

std::string TensorBoardFileName(absl::Time now, absl::string_view host) {
  return absl::StrCat("events.out.tfevents.", absl::ToUnixSeconds(now), ".", host);
}

std::string TensorBoardFileHeader(absl::Time now) {
  std::string event = EventPrefix(absl::ToUnixMicros(now) / 1e6, 0);
  PutBytesField(event, 3, "brain.Event:2");
  return TfRecord(event);
}

std::string TensorBoardRecord(const v1::GlobalSummary& summary) {
  std::string values;
  for (const v1::TelemetryValue& v : summary.values()) {
    for (int i = 0; i < v.values_size(); ++i) {
      const std::string index = ElementIndex(v.shape(), i);
      PutScalar(values, index.empty() ? v.name() : absl::StrCat(v.name(), "/", index),
                v.values(i));
    }
  }
  PutScalar(values, "meshrun/step_time_seconds", static_cast<float>(summary.step_time_seconds()));
  std::string event = EventPrefix(summary.wall_time_unix_micros() / 1e6, summary.step());
  PutBytesField(event, 5, values);
  return TfRecord(event);
}

uint32_t Crc32c(absl::string_view data) {
  const std::array<uint32_t, 256>& table = Crc32cTable();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : data) crc = table[(crc ^ c) & 0xFF] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xA282EAD8u;
}

std::string TfRecord(absl::string_view data) {
  std::string out;
  std::string length;
  PutFixed<uint64_t>(length, data.size());
  out += length;
  PutFixed<uint32_t>(out, MaskedCrc32c(length));
  out.append(data.data(), data.size());
  PutFixed<uint32_t>(out, MaskedCrc32c(data));
  return out;
}

}  // namespace meshrun::telemetry
