#include "coordinator_service/dashboard_api.h"
#include "rpc/tls_credentials.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <initializer_list>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "coordinator_service/coordinator_rpc_handler.h"
#include "telemetry/prometheus.h"

namespace meshrun::services {
namespace {

using telemetry::Labels;
using telemetry::MetricType;

std::string ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  std::string out;
  if (!google::protobuf::util::MessageToJsonString(message, &out, options).ok()) return "{}";
  return out;
}

// A JSON string literal (quotes included).
std::string JsonString(const std::string& text) {
  std::string out = "\"";
  for (unsigned char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      absl::StrAppend(&out, absl::StrFormat("\\u%04x", c));
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

// Only `allowed` may appear in the query; the first other one is named.
absl::Status CheckParams(const HttpRequest& request, std::initializer_list<const char*> allowed) {
  for (const auto& param : request.params) {
    const std::string& name = param.first;
    if (std::find_if(allowed.begin(), allowed.end(),
                     [&](const char* a) { return name == a; }) == allowed.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown query parameter \"", name, "\"; ", request.path, " takes ",
          allowed.size() == 0 ? "none" : absl::StrJoin(allowed, ", ")));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Required(const HttpRequest& request, const char* name) {
  auto it = request.params.find(name);
  if (it == request.params.end() || it->second.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("query parameter \"", name, "\" is missing; e.g. ", request.path, "?",
                     name, "=..."));
  }
  return it->second;
}

absl::StatusOr<int64_t> NonNegative(const char* name, const std::string& value) {
  int64_t n = 0;
  if (!absl::SimpleAtoi(value, &n) || n < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, " is \"", value, "\"; give a non-negative integer step"));
  }
  return n;
}

// "ExecuteTime" -> "execute_time", "TransferToDevice2" -> "transfer_to_device2"; anything
// outside [A-Za-z0-9] becomes "_".
std::string SnakeCase(const std::string& name) {
  std::string out;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    if (absl::ascii_isupper(c)) {
      if (i > 0 && !out.empty() && out.back() != '_') out += '_';
      out += absl::ascii_tolower(c);
    } else {
      out += absl::ascii_isalnum(c) ? c : '_';
    }
  }
  return out;
}

// "JOB_STATE_RUNNING" -> "running".
std::string EnumLabel(const std::string& name, const char* prefix) {
  return absl::AsciiStrToLower(absl::StripPrefix(name, prefix));
}

// Each job's goodput (coordinator/goodput.h): the ratio, and badput seconds by cause.
absl::Status AddGoodput(const v1::ListJobsResponse& jobs, telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(out.Declare("meshrun_job_goodput_ratio", telemetry::MetricType::kGauge,
                              "Productive step time over the job's wall time."));
  RETURN_IF_ERROR(out.Declare("meshrun_job_badput_seconds", telemetry::MetricType::kGauge,
                              "The job's wall time not spent in steps that count, by cause."));
  for (const v1::JobManifest& job : jobs.jobs()) {
    RETURN_IF_ERROR(out.Add("meshrun_job_goodput_ratio", {{"job_id", job.job_id()}},
                            job.goodput().ratio()));
    for (const auto& [cause, seconds] : job.goodput().badput_seconds()) {
      RETURN_IF_ERROR(out.Add("meshrun_job_badput_seconds",
                              {{"job_id", job.job_id()}, {"cause", cause}}, seconds));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<DashboardApi>> DashboardApi::Create(Config config) {
  if (config.handler == nullptr || config.history == nullptr) {
    return absl::InvalidArgumentError("DashboardApi needs a handler and a history store");
  }
  if (config.max_elements_per_series < 1) {
    return absl::InvalidArgumentError("max_elements_per_series must be at least 1");
  }
  return std::unique_ptr<DashboardApi>(new DashboardApi(config));
}

int DashboardApi::HttpCode(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kOk: return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange: return 400;
    case absl::StatusCode::kNotFound: return 404;
    case absl::StatusCode::kFailedPrecondition:
    case absl::StatusCode::kAlreadyExists: return 409;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted: return 503;
    case absl::StatusCode::kDeadlineExceeded: return 504;
    default: return 500;
  }
}

HttpResponse DashboardApi::Handle(const HttpRequest& request) {
  HttpResponse response;
  absl::StatusOr<std::string> body = Route(request, &response.content_type);
  if (!body.ok()) return ErrorResponse(body.status());
  response.body = std::move(*body);
  return response;
}

HttpResponse DashboardApi::ErrorResponse(const absl::Status& status) {
  return {.status = HttpCode(status),
          .body = absl::StrCat("{\"error\":", JsonString(std::string(status.message())), "}\n")};
}

absl::StatusOr<std::string> DashboardApi::Route(const HttpRequest& request,
                                                std::string* content_type) {
  CoordinatorRpcHandler& handler = *config_.handler;
  if (request.path == "/metrics") {
    RETURN_IF_ERROR(CheckParams(request, {}));
    *content_type = "text/plain; version=0.0.4; charset=utf-8";
    return Metrics();
  }
  if (request.path == "/api/jobs") {
    RETURN_IF_ERROR(CheckParams(request, {}));
    v1::ListJobsResponse jobs;
    RETURN_IF_ERROR(handler.ListJobs({}, &jobs));
    return ToJson(jobs);
  }
  if (request.path == "/api/job") {
    RETURN_IF_ERROR(CheckParams(request, {"id"}));
    v1::GetJobRequest get;
    ASSIGN_OR_RETURN(*get.mutable_job_id(), Required(request, "id"));
    v1::JobManifest job;
    RETURN_IF_ERROR(handler.GetJob(get, &job));
    return ToJson(job);
  }
  if (request.path == "/api/workers") {
    RETURN_IF_ERROR(CheckParams(request, {}));
    v1::ListWorkersResponse workers;
    RETURN_IF_ERROR(handler.ListWorkers({}, &workers));
    return ToJson(workers);
  }
  if (request.path == "/api/memory") {
    RETURN_IF_ERROR(CheckParams(request, {"host"}));
    v1::GetDeviceMemoryRequest get;
    ASSIGN_OR_RETURN(*get.mutable_host(), Required(request, "host"));
    v1::GetDeviceMemoryResponse memory;
    RETURN_IF_ERROR(handler.GetDeviceMemory(get, &memory));
    return ToJson(memory);
  }
  if (request.path == "/api/series") {
    RETURN_IF_ERROR(CheckParams(request, {"job"}));
    ASSIGN_OR_RETURN(std::string job, Required(request, "job"));
    ASSIGN_OR_RETURN(std::vector<v1::TelemetryDeclaration> series,
                     config_.history->Series(job));
    std::vector<std::string> items;
    for (const v1::TelemetryDeclaration& declaration : series) items.push_back(ToJson(declaration));
    return absl::StrCat("{\"job_id\":", JsonString(job), ",\"series\":[",
                        absl::StrJoin(items, ","), "]}");
  }
  return absl::NotFoundError(absl::StrCat(
      "no such path ", request.path,
      "; try / (the dashboard), /metrics, /api/jobs, /api/workers"));
}

absl::StatusOr<std::shared_ptr<telemetry::Watcher>> DashboardApi::OpenWatch(
    const HttpRequest& request) {
  RETURN_IF_ERROR(CheckParams(request, {"job", "since_step"}));
  ASSIGN_OR_RETURN(std::string job, Required(request, "job"));
  int64_t since_step = 0;
  if (auto it = request.params.find("since_step"); it != request.params.end()) {
    ASSIGN_OR_RETURN(since_step, NonNegative("since_step", it->second));
  }
  // A reconnecting EventSource resumes after the last event it saw.
  if (!request.last_event_id.empty()) {
    ASSIGN_OR_RETURN(int64_t last, NonNegative("Last-Event-ID", request.last_event_id));
    since_step = std::max(since_step, last + 1);
  }
  return config_.handler->telemetry().hub().Subscribe({.job_id = job, .since_step = since_step});
}

std::string DashboardApi::SummaryEvent(const v1::GlobalSummary& summary) {
  return absl::StrCat("id: ", summary.step(), "\nevent: summary\ndata: ", ToJson(summary),
                      "\n\n");
}

std::string DashboardApi::EndEvent(const absl::Status& status, int64_t resume_step) {
  return absl::StrCat("event: end\ndata: {\"status\":",
                      JsonString(absl::StatusCodeToString(status.code())),
                      ",\"message\":", JsonString(std::string(status.message())),
                      ",\"resume_step\":", resume_step, "}\n\n");
}

absl::StatusOr<std::string> DashboardApi::Metrics() {
  CoordinatorRpcHandler& handler = *config_.handler;
  telemetry::PrometheusText out;
  RETURN_IF_ERROR(out.Declare("meshrun_build_info", MetricType::kGauge,
                              "1, labelled with this build's version (CMake project version)."));
  RETURN_IF_ERROR(out.Add("meshrun_build_info", {{"version", MESHRUN_VERSION}}, 1));

  // Jobs: a count per state (every state, so absent ones read 0) and each job's own state.
  v1::ListJobsResponse jobs;
  RETURN_IF_ERROR(handler.ListJobs({}, &jobs));
  RETURN_IF_ERROR(out.Declare("meshrun_insecure_plaintext", MetricType::kGauge,
                              "1 when this coordinator serves plaintext beyond loopback (--insecure)."));
  RETURN_IF_ERROR(out.Add("meshrun_insecure_plaintext", {}, ServingInsecurely() ? 1 : 0));
  RETURN_IF_ERROR(out.Declare("meshrun_jobs", MetricType::kGauge, "Jobs by state."));
  std::map<std::string, int> by_state;
  for (int s = v1::JobState_MIN + 1; s <= v1::JobState_MAX; ++s) {
    by_state[EnumLabel(v1::JobState_Name(s), "JOB_STATE_")] = 0;
  }
  for (const v1::JobManifest& job : jobs.jobs()) {
    ++by_state[EnumLabel(v1::JobState_Name(job.state()), "JOB_STATE_")];
  }
  for (const auto& [state, count] : by_state) {
    RETURN_IF_ERROR(out.Add("meshrun_jobs", {{"state", state}}, count));
  }
  RETURN_IF_ERROR(out.Declare("meshrun_job_state", MetricType::kGauge,
                              "1 for the job's current state."));
  RETURN_IF_ERROR(out.Declare("meshrun_job_last_step", MetricType::kGauge,
                              "Last step the job's hosts reported."));
  RETURN_IF_ERROR(out.Declare("meshrun_job_compile_seconds", MetricType::kGauge,
                              "Time spent compiling the job's programs."));
  RETURN_IF_ERROR(out.Declare("meshrun_job_executable_sent_bytes", MetricType::kGauge,
                              "Executable bytes streamed to the job's workers."));
  RETURN_IF_ERROR(out.Declare("meshrun_host_straggler", MetricType::kGauge,
                              "1 for each host the straggler detector flags in a running job."));
  for (const v1::JobManifest& job : jobs.jobs()) {
    const std::string& id = job.job_id();
    RETURN_IF_ERROR(out.Add("meshrun_job_state",
                            {{"job_id", id}, {"state", EnumLabel(v1::JobState_Name(job.state()),
                                                              "JOB_STATE_")}},
                            1));
    RETURN_IF_ERROR(out.Add("meshrun_job_last_step", {{"job_id", id}}, job.last_step()));
    RETURN_IF_ERROR(out.Add("meshrun_job_compile_seconds", {{"job_id", id}}, job.compile_seconds()));
    RETURN_IF_ERROR(out.Add("meshrun_job_executable_sent_bytes", {{"job_id", id}},
                            job.executable_bytes_sent()));
    for (const std::string& host : job.straggler_hosts()) {
      RETURN_IF_ERROR(out.Add("meshrun_host_straggler", {{"job_id", id}, {"host", host}}, 1));
    }
  }
  RETURN_IF_ERROR(AddGoodput(jobs, out));
  RETURN_IF_ERROR(out.Declare("meshrun_job_step_time_seconds", MetricType::kHistogram,
                              "Step times of the job's summarized steps (max over hosts; one "
                              "per telemetry summary, re-run steps included)."));
  for (const auto& [id, histogram] : handler.telemetry().step_times().Histograms()) {
    RETURN_IF_ERROR(out.AddHistogram("meshrun_job_step_time_seconds", {{"job_id", id}},
                                     histogram));
  }

  // Workers, from the registry.
  v1::ListWorkersResponse workers;
  RETURN_IF_ERROR(handler.ListWorkers({}, &workers));
  RETURN_IF_ERROR(out.Declare("meshrun_worker_up", MetricType::kGauge,
                              "1 while the worker is alive, 0 when dead or left."));
  RETURN_IF_ERROR(out.Declare("meshrun_worker_state", MetricType::kGauge,
                              "1 for the worker's current state."));
  RETURN_IF_ERROR(out.Declare("meshrun_worker_last_heartbeat_timestamp_seconds",
                              MetricType::kGauge, "Unix time of the worker's last heartbeat."));
  RETURN_IF_ERROR(out.Declare("meshrun_worker_devices", MetricType::kGauge,
                              "Devices the worker registered."));
  RETURN_IF_ERROR(out.Declare("meshrun_worker_insecure_plaintext", MetricType::kGauge,
                              "1 when the worker serves plaintext beyond loopback (--insecure)."));
  std::vector<std::string> alive;
  for (const v1::WorkerStatus& worker : workers.workers()) {
    const std::string& host = worker.registration().host();
    const bool up = worker.state() == v1::WORKER_STATE_ALIVE;
    if (up) alive.push_back(host);
    RETURN_IF_ERROR(out.Add("meshrun_worker_up", {{"host", host}}, up ? 1 : 0));
    RETURN_IF_ERROR(out.Add(
        "meshrun_worker_state",
        {{"host", host}, {"state", EnumLabel(v1::WorkerState_Name(worker.state()),
                                             "WORKER_STATE_")}},
        1));
    RETURN_IF_ERROR(out.Add("meshrun_worker_last_heartbeat_timestamp_seconds", {{"host", host}},
                            worker.last_heartbeat_unix_micros() / 1e6));
    RETURN_IF_ERROR(out.Add("meshrun_worker_devices", {{"host", host}},
                            worker.registration().devices_size()));
    RETURN_IF_ERROR(out.Add("meshrun_worker_insecure_plaintext", {{"host", host}},
                            worker.registration().insecure() ? 1 : 0));
  }

  // The workers' torch_xla-style metrics (asked of each alive worker; one that cannot answer
  // is left out of this scrape).
  v1::GetMetricsResponse metrics;
  RETURN_IF_ERROR(handler.GetMetrics({}, &metrics));
  // One family per worker metric, the unit in its name: ExecuteTime ->
  // meshrun_worker_execute_time_seconds_total (its total) and
  // meshrun_worker_execute_time_samples_total (its sample count); TransferToDeviceBytes ->
  // meshrun_worker_transfer_to_device_bytes_total and ..._bytes_samples_total; a counter
  // (Steps) -> meshrun_worker_steps_total.
  for (const v1::HostMetrics& host : metrics.hosts()) {
    for (const v1::Metric& metric : host.metrics()) {
      const std::string base = "meshrun_worker_" + SnakeCase(metric.name());
      const Labels labels = {{"host", host.host()}};
      const bool timed = metric.unit() == "seconds" || metric.unit() == "bytes";
      const std::string count = base + (timed ? "_samples_total" : "_total");
      RETURN_IF_ERROR(out.Declare(count, MetricType::kCounter,
                                  absl::StrCat("Samples or events of the worker metric ",
                                               metric.name(), ".")));
      RETURN_IF_ERROR(out.Add(count, labels, metric.count()));
      if (timed) {
        const std::string unit = "_" + metric.unit();  // TransferToDeviceBytes: once
        const std::string total =
            (absl::EndsWith(base, unit) ? base : base + unit) + "_total";
        RETURN_IF_ERROR(out.Declare(total, MetricType::kCounter,
                                    absl::StrCat("Total ", metric.unit(), " of the worker metric ",
                                                 metric.name(), ".")));
        RETURN_IF_ERROR(out.Add(total, labels, metric.total()));
      }
    }
  }
  RETURN_IF_ERROR(out.Declare("meshrun_device_memory_used_bytes", MetricType::kGauge,
                              "Device memory in use, where the runtime reports it."));
  RETURN_IF_ERROR(out.Declare("meshrun_device_memory_limit_bytes", MetricType::kGauge,
                              "Device memory limit, where the runtime reports it."));
  for (const std::string& host : alive) {
    v1::GetDeviceMemoryRequest ask;
    ask.set_host(host);
    v1::GetDeviceMemoryResponse memory;
    if (!handler.GetDeviceMemory(ask, &memory).ok()) continue;
    for (const v1::DeviceMemory& device : memory.devices()) {
      const Labels labels = {{"host", host}, {"device", device.runtime_name()}};
      if (device.has_bytes_in_use()) {
        RETURN_IF_ERROR(out.Add("meshrun_device_memory_used_bytes", labels, device.bytes_in_use()));
      }
      if (device.has_bytes_limit()) {
        RETURN_IF_ERROR(out.Add("meshrun_device_memory_limit_bytes", labels, device.bytes_limit()));
      }
    }
  }

  // Latest global telemetry per job with history.
  RETURN_IF_ERROR(out.Declare("meshrun_telemetry_step", MetricType::kGauge,
                              "Step of the job's latest global summary."));
  RETURN_IF_ERROR(out.Declare("meshrun_telemetry_step_time_seconds", MetricType::kGauge,
                              "Step time of the latest global summary (max over hosts)."));
  RETURN_IF_ERROR(out.Declare("meshrun_telemetry_partial", MetricType::kGauge,
                              "1 when the latest global summary missed some hosts."));
  RETURN_IF_ERROR(out.Declare("meshrun_telemetry_value", MetricType::kGauge,
                              "Latest global value of each series element (row-major index)."));
  RETURN_IF_ERROR(out.Declare("meshrun_telemetry_value_stat", MetricType::kGauge,
                              "Min, max and mean of the latest value of large vector series."));
  RETURN_IF_ERROR(out.Declare("meshrun_telemetry_threshold_exceeded", MetricType::kGauge,
                              "1 when the series crossed its declared threshold at the latest "
                              "summary."));
  ASSIGN_OR_RETURN(std::vector<telemetry::HistoryStore::JobInfo> history,
                   config_.history->ListJobs());
  for (const telemetry::HistoryStore::JobInfo& info : history) {
    if (info.summaries == 0) continue;
    absl::StatusOr<std::vector<v1::GlobalSummary>> latest =
        config_.history->Read({.job_id = info.job_id, .since_step = info.latest_step, .limit = 1});
    if (!latest.ok() || latest->empty()) continue;  // pruned or removed since ListJobs
    const v1::GlobalSummary& summary = latest->front();
    const std::string& job = info.job_id;
    RETURN_IF_ERROR(out.Add("meshrun_telemetry_step", {{"job_id", job}}, summary.step()));
    RETURN_IF_ERROR(out.Add("meshrun_telemetry_step_time_seconds", {{"job_id", job}},
                            summary.step_time_seconds()));
    RETURN_IF_ERROR(out.Add("meshrun_telemetry_partial", {{"job_id", job}}, summary.partial()));
    for (const v1::TelemetryValue& value : summary.values()) {
      const int n = value.values_size();
      if (n <= config_.max_elements_per_series) {
        for (int i = 0; i < n; ++i) {
          RETURN_IF_ERROR(out.Add("meshrun_telemetry_value",
                                  {{"job_id", job}, {"series", value.name()},
                                   {"index", absl::StrCat(i)}},
                                  value.values(i)));
        }
      } else {
        double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0;
        for (float v : value.values()) {
          lo = std::min<double>(lo, v);
          hi = std::max<double>(hi, v);
          sum += v;
        }
        const std::initializer_list<std::pair<const char*, double>> stats = {
            {"min", lo}, {"max", hi}, {"mean", sum / n}};
        for (const auto& [stat, v] : stats) {
          RETURN_IF_ERROR(out.Add("meshrun_telemetry_value_stat",
                                  {{"job_id", job}, {"series", value.name()}, {"stat", stat}}, v));
        }
      }
      RETURN_IF_ERROR(out.Add("meshrun_telemetry_threshold_exceeded",
                              {{"job_id", job}, {"series", value.name()}},
                              value.threshold_exceeded()));
    }
  }
  return out.Render();
}

}  // namespace meshrun::services
