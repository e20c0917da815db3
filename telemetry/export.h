// Formats for `meshrun export`: a job's global summaries as CSV, JSON lines or TensorBoard event
// files. Pure formatting: the caller reads the summaries (WatchTelemetry, history only) and
// writes the returned bytes.
//
//   csv          one row per (step, series, element):
//                  step,wall_time_unix_micros,series,element,index,value,partial
//                element is the row-major position in the series, index the same position per
//                dimension joined by "/" (e.g. "3/1"; empty for a scalar). NaN is written "nan".
//   jsonl        one JSON object per step: step, wall_time_unix_micros, step_time_seconds,
//                partial, missing_hosts, synthetic_data, and values: {series: {shape: [...],
//                values: [...]}} (row-major; NaN and infinities as null).
//   tensorboard  a TensorBoard event file: TFRecord framing (length, masked CRC32C of the
//                length, data, masked CRC32C of the data) around Event protos encoded here by
//                hand. The first event carries the file version; then one event per step with
//                one scalar per element, tagged "series" for a scalar and "series/i/j" for an
//                element of a vector or matrix, plus "meshrun/step_time_seconds".
//
// Thread-safety: every function is pure (safe to call concurrently).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "meshrun/v1/telemetry.pb.h"

namespace meshrun::telemetry {

enum class ExportFormat { kCsv, kJsonl, kTensorBoard };

// Errors: INVALID_ARGUMENT naming the format given and listing csv, jsonl, tensorboard.
absl::StatusOr<ExportFormat> ParseExportFormat(absl::string_view name);

// CSV: the header line, then the rows of one summary (each line ends with '\n').
std::string CsvHeader();
std::string CsvRows(const v1::GlobalSummary& summary);

// JSON lines: one summary as one line ending with '\n'.
std::string JsonLine(const v1::GlobalSummary& summary);

// TensorBoard: the file name for a writer started at `now` on `host`
// ("events.out.tfevents.<unix seconds>.<host>"), the first record of the file, then one
// record per summary.
std::string TensorBoardFileName(absl::Time now, absl::string_view host);
std::string TensorBoardFileHeader(absl::Time now);
std::string TensorBoardRecord(const v1::GlobalSummary& summary);

// CRC-32C (Castagnoli), and the masked form TFRecord stores.
uint32_t Crc32c(absl::string_view data);
uint32_t MaskedCrc32c(absl::string_view data);
// One TFRecord around `data`.
std::string TfRecord(absl::string_view data);

}  // namespace meshrun::telemetry
