// `meshrun watch` and `meshrun export`: a job's telemetry, live or its history.
#include "cli/cli_telemetry.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "rpc/binary_setup.h"
#include "cli/cli_common.h"
#include "telemetry/export.h"

ABSL_FLAG(int64_t, since_step, 0,
          "watch, export: first step to show (watch: history first, then live)");
ABSL_FLAG(std::vector<std::string>, series, {},
          "watch, export: only these series (comma-separated); default every series");
ABSL_FLAG(std::string, format, "",
          "export: csv (default), jsonl or tensorboard; --output=json means jsonl");
ABSL_FLAG(std::string, out, "",
          "export: output file (csv, jsonl; default stdout) or directory (tensorboard; default "
          "./tensorboard/<job-id>)");

namespace meshrun::services {
namespace {

// Eight-level bars of the last values, scaled to their own range.
std::string Sparkline(const std::deque<float>& values) {
  static const char* kBars[] = {"▁", "▂", "▃", "▄", "▅", "▆", "▇", "█"};
  if (values.empty()) return "";
  const auto [lo, hi] = std::minmax_element(values.begin(), values.end());
  std::string out;
  for (float v : values) {
    const int level = *hi > *lo ? static_cast<int>((v - *lo) / (*hi - *lo) * 7.0f + 0.5f) : 0;
    out += kBars[std::clamp(level, 0, 7)];
  }
  return out;
}

}  // namespace

int Watch(const std::vector<std::string>& args) {
  if (args.size() != 3) ExitWithError("usage: meshrun watch <job-id>", 2);
  auto stub = CoordinatorStub();
  v1::WatchTelemetryRequest request;
  request.set_job_id(args[2]);
  request.set_since_step(absl::GetFlag(FLAGS_since_step));
  for (const std::string& name : absl::GetFlag(FLAGS_series)) request.add_names(name);
  grpc::ClientContext context;  // a watch lasts as long as the job: no deadline
  auto reader = stub->WatchTelemetryBatches(&context, request);
  bool header = false;
  std::deque<float> first_series;
  const bool json = JsonOutput();
  const auto show = [&](const v1::GlobalSummary& summary) {
    if (json) {
      PrintJson(summary);
      std::fflush(stdout);
      return;
    }
    if (summary.has_rewind()) {  // the job restarted: the steps after summary.step() come again
      const v1::JobRewind& r = summary.rewind();
      std::printf("-- run %d: restarted from the checkpoint of step %lld (%lld steps run again)"
                  "; %s: %s\n",
                  r.attempt(), static_cast<long long>(summary.step()),
                  static_cast<long long>(r.steps_lost()), r.host().c_str(), r.cause().c_str());
      std::fflush(stdout);
      return;
    }
    if (!header) {
      std::printf("%8s", "STEP");
      for (const v1::TelemetryValue& v : summary.values()) {
        const std::string name = v.values_size() == 1 ? v.name() : v.name() + "(mean)";
        std::printf(" %14s", name.substr(0, 14).c_str());
      }
      std::printf(" %10s  %s\n", "STEP_TIME", "TREND");
      header = true;
    }
    std::printf("%8lld", static_cast<long long>(summary.step()));
    for (const v1::TelemetryValue& v : summary.values()) {
      double sum = 0;
      for (float x : v.values()) sum += x;
      const double shown = v.values_size() > 0 ? sum / v.values_size() : 0;
      std::printf(" %13.6g%s", shown, v.threshold_exceeded() ? "!" : " ");
    }
    if (summary.values_size() > 0 && summary.values(0).values_size() > 0) {
      first_series.push_back(summary.values(0).values(0));
      if (first_series.size() > 24) first_series.pop_front();
    }
    std::printf(" %8.1fms  %s%s%s%s\n", summary.step_time_seconds() * 1e3,
                Sparkline(first_series).c_str(),
                summary.synthetic_data() ? "  SYNTHETIC DATA" : "",
                summary.partial() ? "  partial, missing: " : "",
                absl::StrJoin(summary.missing_hosts(), ",").c_str());
    std::fflush(stdout);
  };
  v1::GlobalSummaryBatch batch;
  while (reader->Read(&batch)) {
    for (const v1::GlobalSummary& summary : batch.summaries()) show(summary);
  }
  grpc::Status status = reader->Finish();
  if (!status.ok()) {
    ExitWithError(absl::StrCat("watch ", args[2], ": ", status.error_message()), 1);
  }
  return 0;
}

// Reads the job's history (WatchTelemetryBatches, history only) and writes it in the chosen
// format.
// The output is created at the first summary, so a refused export leaves no file behind.
int Export(const std::vector<std::string>& args) {
  if (args.size() != 3) {
    ExitWithError("usage: meshrun export <job-id> --format=csv|jsonl|tensorboard [--out=PATH]", 2);
  }
  const std::string& job = args[2];
  // --output=json means JSON lines, the jsonl format; another --format beside it is a conflict.
  std::string format_name = absl::GetFlag(FLAGS_format);
  if (JsonOutput()) {
    if (!format_name.empty() && format_name != "jsonl") {
      ExitWithError("export: --output=json writes JSON lines (--format=jsonl); drop --format=" +
                        format_name + " or --output=json",
                    kExitUsage);
    }
    format_name = "jsonl";
  }
  absl::StatusOr<telemetry::ExportFormat> format =
      telemetry::ParseExportFormat(format_name.empty() ? "csv" : format_name);
  if (!format.ok()) ExitWithError(std::string(format.status().message()), kExitUsage);
  const bool tensorboard = *format == telemetry::ExportFormat::kTensorBoard;
  std::string out = absl::GetFlag(FLAGS_out);
  std::string dir;  // tensorboard: created with the file
  if (tensorboard) {
    dir = out.empty() ? "tensorboard/" + job : out;
    char host[256] = "localhost";
    gethostname(host, sizeof(host) - 1);
    out = dir + "/" + telemetry::TensorBoardFileName(absl::Now(), host);
  }

  auto stub = CoordinatorStub();
  v1::WatchTelemetryRequest request;
  request.set_job_id(job);
  request.set_since_step(absl::GetFlag(FLAGS_since_step));
  for (const std::string& name : absl::GetFlag(FLAGS_series)) request.add_names(name);
  request.set_history_only(true);
  grpc::ClientContext context;  // long histories take as long as they take: no deadline
  auto reader = stub->WatchTelemetryBatches(&context, request);
  std::FILE* file = nullptr;
  auto write = [&](const std::string& bytes) {
    if (file == nullptr) {
      std::error_code error;
      if (!dir.empty()) std::filesystem::create_directories(dir, error);
      if (error) ExitWithError(absl::StrCat("--out=", dir, ": ", error.message()), 1);
      file = out.empty() ? stdout : std::fopen(out.c_str(), "wb");
      if (file == nullptr) {
        ExitWithError(absl::StrCat("--out=", out, ": ", std::strerror(errno)), 1);
      }
      if (*format == telemetry::ExportFormat::kCsv) {
        std::fputs(telemetry::CsvHeader().c_str(), file);
      }
      if (tensorboard) {
        const std::string header = telemetry::TensorBoardFileHeader(absl::Now());
        std::fwrite(header.data(), 1, header.size(), file);
      }
    }
    if (std::fwrite(bytes.data(), 1, bytes.size(), file) != bytes.size()) {
      ExitWithError(absl::StrCat("writing ", out, ": ", std::strerror(errno)), 1);
    }
  };
  v1::GlobalSummaryBatch batch;
  int64_t steps = 0;
  while (reader->Read(&batch)) {
    for (const v1::GlobalSummary& summary : batch.summaries()) {
      switch (*format) {
        case telemetry::ExportFormat::kCsv: write(telemetry::CsvRows(summary)); break;
        case telemetry::ExportFormat::kJsonl: write(telemetry::JsonLine(summary)); break;
        case telemetry::ExportFormat::kTensorBoard:
          write(telemetry::TensorBoardRecord(summary));
          break;
      }
      ++steps;
    }
  }
  CheckCall(reader->Finish(), "export " + job);
  if (file == nullptr) write("");  // an empty history still gets a valid (empty) file
  if (file != stdout && std::fclose(file) != 0) {
    ExitWithError(absl::StrCat("writing ", out, ": ", std::strerror(errno)), 1);
  }
  std::fprintf(stderr, "exported %lld steps of %s to %s\n", static_cast<long long>(steps),
               job.c_str(), out.empty() ? "stdout" : out.c_str());
  return 0;
}

}  // namespace meshrun::services
