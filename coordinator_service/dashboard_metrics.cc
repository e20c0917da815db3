#include "coordinator_service/dashboard_metrics.h"
#include "rpc/refusal_log.h"
#include "rpc/tls_credentials.h"

#include <algorithm>
#include <initializer_list>
#include <limits>
#include <map>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "coordinator_service/coordinator_rpc_handler.h"
#include "telemetry/prometheus.h"

namespace meshrun::services {
namespace {

// DashboardMetrics is one step per group of families, called in the order the families
// appear in the text (the writer renders families in the order first declared).

using telemetry::Labels;
using telemetry::MetricType;

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

struct Family {
  const char* name;
  MetricType type;
  const char* help;
};

absl::Status DeclareAll(telemetry::PrometheusText& out, std::initializer_list<Family> families) {
  for (const Family& family : families) {
    RETURN_IF_ERROR(out.Declare(family.name, family.type, family.help));
  }
  return absl::OkStatus();
}

absl::Status AddBuildInfo(telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(out.Declare("meshrun_build_info", MetricType::kGauge,
                              "1, labelled with this build's version (CMake project version)."));
  return out.Add("meshrun_build_info", {{"version", MESHRUN_VERSION}}, 1);
}

absl::Status AddInsecurePlaintext(telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(
      out.Declare("meshrun_insecure_plaintext", MetricType::kGauge,
                  "1 when this coordinator serves plaintext beyond loopback (--insecure)."));
  return out.Add("meshrun_insecure_plaintext", {}, ServingInsecurely() ? 1 : 0);
}

// Refused calls by caller and reason (rpc/refusal_log.h): who is being turned away, and why.
absl::Status AddRefusals(telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(out.Declare("meshrun_refused_calls_total", MetricType::kCounter,
                              "Calls refused (authentication, roles, quotas), by caller and "
                              "reason."));
  for (const auto& [key, count] : RefusalLog::Process().Counts()) {
    RETURN_IF_ERROR(out.Add("meshrun_refused_calls_total",
                            {{"caller", key.first}, {"reason", key.second}},
                            static_cast<double>(count)));
  }
  return absl::OkStatus();
}

// A count per job state: every state, so absent ones read 0.
absl::Status AddJobCounts(const v1::ListJobsResponse& jobs, telemetry::PrometheusText& out) {
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
  return absl::OkStatus();
}

absl::Status AddJob(const v1::JobManifest& job, telemetry::PrometheusText& out) {
  const std::string& id = job.job_id();
  RETURN_IF_ERROR(out.Add("meshrun_job_state",
                          {{"job_id", id},
                           {"state", EnumLabel(v1::JobState_Name(job.state()), "JOB_STATE_")}},
                          1));
  RETURN_IF_ERROR(out.Add("meshrun_job_last_step", {{"job_id", id}}, job.last_step()));
  RETURN_IF_ERROR(out.Add("meshrun_job_compile_seconds", {{"job_id", id}}, job.compile_seconds()));
  RETURN_IF_ERROR(out.Add("meshrun_job_executable_sent_bytes", {{"job_id", id}},
                          job.executable_bytes_sent()));
  for (const std::string& host : job.straggler_hosts()) {
    RETURN_IF_ERROR(out.Add("meshrun_host_straggler", {{"job_id", id}, {"host", host}}, 1));
  }
  return absl::OkStatus();
}

// Each job's own state, progress, compile time, bytes sent and straggling hosts.
absl::Status AddJobs(const v1::ListJobsResponse& jobs, telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(DeclareAll(
      out, {{"meshrun_job_state", MetricType::kGauge, "1 for the job's current state."},
            {"meshrun_job_last_step", MetricType::kGauge, "Last step the job's hosts reported."},
            {"meshrun_job_compile_seconds", MetricType::kGauge,
             "Time spent compiling the job's programs."},
            {"meshrun_job_executable_sent_bytes", MetricType::kGauge,
             "Executable bytes streamed to the job's workers."},
            {"meshrun_host_straggler", MetricType::kGauge,
             "1 for each host the straggler detector flags in a running job."}}));
  for (const v1::JobManifest& job : jobs.jobs()) RETURN_IF_ERROR(AddJob(job, out));
  return absl::OkStatus();
}

absl::Status AddStepTimes(const coordinator::StepTimes& step_times,
                          telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(out.Declare("meshrun_job_step_time_seconds", MetricType::kHistogram,
                              "Step times of the job's summarized steps (max over hosts; one "
                              "per telemetry summary, re-run steps included)."));
  for (const auto& [id, histogram] : step_times.Histograms()) {
    RETURN_IF_ERROR(out.AddHistogram("meshrun_job_step_time_seconds", {{"job_id", id}},
                                     histogram));
  }
  return absl::OkStatus();
}

absl::Status AddWorker(const v1::WorkerStatus& worker, telemetry::PrometheusText& out) {
  const std::string& host = worker.registration().host();
  const bool up = worker.state() == v1::WORKER_STATE_ALIVE;
  RETURN_IF_ERROR(out.Add("meshrun_worker_up", {{"host", host}}, up ? 1 : 0));
  RETURN_IF_ERROR(out.Add(
      "meshrun_worker_state",
      {{"host", host},
       {"state", EnumLabel(v1::WorkerState_Name(worker.state()), "WORKER_STATE_")}},
      1));
  RETURN_IF_ERROR(out.Add("meshrun_worker_last_heartbeat_timestamp_seconds", {{"host", host}},
                          worker.last_heartbeat_unix_micros() / 1e6));
  RETURN_IF_ERROR(out.Add("meshrun_worker_devices", {{"host", host}},
                          worker.registration().devices_size()));
  return out.Add("meshrun_worker_insecure_plaintext", {{"host", host}},
                 worker.registration().insecure() ? 1 : 0);
}

// The registry: each worker's liveness, state, last heartbeat, devices and transport.
absl::Status AddWorkers(const v1::ListWorkersResponse& workers, telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(DeclareAll(
      out, {{"meshrun_worker_up", MetricType::kGauge,
             "1 while the worker is alive, 0 when dead or left."},
            {"meshrun_worker_state", MetricType::kGauge, "1 for the worker's current state."},
            {"meshrun_worker_last_heartbeat_timestamp_seconds", MetricType::kGauge,
             "Unix time of the worker's last heartbeat."},
            {"meshrun_worker_devices", MetricType::kGauge, "Devices the worker registered."},
            {"meshrun_worker_insecure_plaintext", MetricType::kGauge,
             "1 when the worker serves plaintext beyond loopback (--insecure)."}}));
  for (const v1::WorkerStatus& worker : workers.workers()) RETURN_IF_ERROR(AddWorker(worker, out));
  return absl::OkStatus();
}

std::vector<std::string> AliveHosts(const v1::ListWorkersResponse& workers) {
  std::vector<std::string> alive;
  for (const v1::WorkerStatus& worker : workers.workers()) {
    if (worker.state() == v1::WORKER_STATE_ALIVE) alive.push_back(worker.registration().host());
  }
  return alive;
}

// One family per worker metric, the unit in its name: ExecuteTime ->
// meshrun_worker_execute_time_seconds_total (its total) and
// meshrun_worker_execute_time_samples_total (its sample count); TransferToDeviceBytes ->
// meshrun_worker_transfer_to_device_bytes_total and ..._bytes_samples_total; a counter
// (Steps) -> meshrun_worker_steps_total.
absl::Status AddWorkerMetric(const std::string& host, const v1::Metric& metric,
                             telemetry::PrometheusText& out) {
  const std::string base = "meshrun_worker_" + SnakeCase(metric.name());
  const Labels labels = {{"host", host}};
  const bool timed = metric.unit() == "seconds" || metric.unit() == "bytes";
  const std::string count = base + (timed ? "_samples_total" : "_total");
  RETURN_IF_ERROR(out.Declare(count, MetricType::kCounter,
                              absl::StrCat("Samples or events of the worker metric ",
                                           metric.name(), ".")));
  RETURN_IF_ERROR(out.Add(count, labels, metric.count()));
  if (!timed) return absl::OkStatus();
  const std::string unit = "_" + metric.unit();  // TransferToDeviceBytes: once
  const std::string total = (absl::EndsWith(base, unit) ? base : base + unit) + "_total";
  RETURN_IF_ERROR(out.Declare(total, MetricType::kCounter,
                              absl::StrCat("Total ", metric.unit(), " of the worker metric ",
                                           metric.name(), ".")));
  return out.Add(total, labels, metric.total());
}

// The workers' torch_xla-style metrics (asked of each alive worker; one that cannot answer is
// left out of this scrape).
absl::Status AddWorkerMetrics(const v1::GetMetricsResponse& metrics,
                              telemetry::PrometheusText& out) {
  for (const v1::HostMetrics& host : metrics.hosts()) {
    for (const v1::Metric& metric : host.metrics()) {
      RETURN_IF_ERROR(AddWorkerMetric(host.host(), metric, out));
    }
  }
  return absl::OkStatus();
}

absl::Status AddHostDeviceMemory(const std::string& host,
                                 const v1::GetDeviceMemoryResponse& memory,
                                 telemetry::PrometheusText& out) {
  for (const v1::DeviceMemory& device : memory.devices()) {
    const Labels labels = {{"host", host}, {"device", device.runtime_name()}};
    if (device.has_bytes_in_use()) {
      RETURN_IF_ERROR(out.Add("meshrun_device_memory_used_bytes", labels, device.bytes_in_use()));
    }
    if (device.has_bytes_limit()) {
      RETURN_IF_ERROR(out.Add("meshrun_device_memory_limit_bytes", labels, device.bytes_limit()));
    }
  }
  return absl::OkStatus();
}

// Device memory of each alive worker that answers (one that does not is left out).
absl::Status AddDeviceMemory(CoordinatorRpcHandler& handler, const std::vector<std::string>& alive,
                             telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(DeclareAll(
      out, {{"meshrun_device_memory_used_bytes", MetricType::kGauge,
             "Device memory in use, where the runtime reports it."},
            {"meshrun_device_memory_limit_bytes", MetricType::kGauge,
             "Device memory limit, where the runtime reports it."}}));
  for (const std::string& host : alive) {
    v1::GetDeviceMemoryRequest ask;
    ask.set_host(host);
    v1::GetDeviceMemoryResponse memory;
    if (!handler.GetDeviceMemory(ask, &memory).ok()) continue;
    RETURN_IF_ERROR(AddHostDeviceMemory(host, memory, out));
  }
  return absl::OkStatus();
}

// A vector series too large for one sample per element: its min, max and mean.
absl::Status AddSeriesStats(const std::string& job, const v1::TelemetryValue& value,
                            telemetry::PrometheusText& out) {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo, sum = 0;
  for (float v : value.values()) {
    lo = std::min<double>(lo, v);
    hi = std::max<double>(hi, v);
    sum += v;
  }
  const std::initializer_list<std::pair<const char*, double>> stats = {
      {"min", lo}, {"max", hi}, {"mean", sum / value.values_size()}};
  for (const auto& [stat, v] : stats) {
    RETURN_IF_ERROR(out.Add("meshrun_telemetry_value_stat",
                            {{"job_id", job}, {"series", value.name()}, {"stat", stat}}, v));
  }
  return absl::OkStatus();
}

// One series of a summary: a sample per element (row-major index) up to
// `max_elements`, else its stats; and whether it crossed its threshold.
absl::Status AddSeries(const std::string& job, const v1::TelemetryValue& value, int max_elements,
                       telemetry::PrometheusText& out) {
  const int n = value.values_size();
  if (n <= max_elements) {
    for (int i = 0; i < n; ++i) {
      RETURN_IF_ERROR(out.Add("meshrun_telemetry_value",
                              {{"job_id", job}, {"series", value.name()},
                               {"index", absl::StrCat(i)}},
                              value.values(i)));
    }
  } else {
    RETURN_IF_ERROR(AddSeriesStats(job, value, out));
  }
  return out.Add("meshrun_telemetry_threshold_exceeded",
                 {{"job_id", job}, {"series", value.name()}}, value.threshold_exceeded());
}

absl::Status AddSummary(const std::string& job, const v1::GlobalSummary& summary,
                        int max_elements, telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(out.Add("meshrun_telemetry_step", {{"job_id", job}}, summary.step()));
  RETURN_IF_ERROR(out.Add("meshrun_telemetry_step_time_seconds", {{"job_id", job}},
                          summary.step_time_seconds()));
  RETURN_IF_ERROR(out.Add("meshrun_telemetry_partial", {{"job_id", job}}, summary.partial()));
  if (summary.tflops_per_device() > 0) {
    RETURN_IF_ERROR(out.Add("meshrun_telemetry_tflops_per_device", {{"job_id", job}},
                            summary.tflops_per_device()));
  }
  if (summary.mfu() > 0) {
    RETURN_IF_ERROR(out.Add("meshrun_telemetry_mfu", {{"job_id", job}}, summary.mfu()));
  }
  for (const v1::TelemetryValue& value : summary.values()) {
    RETURN_IF_ERROR(AddSeries(job, value, max_elements, out));
  }
  return absl::OkStatus();
}

// The latest global summary of each job with history.
absl::Status AddLatestTelemetry(telemetry::HistoryStore& history, int max_elements,
                                telemetry::PrometheusText& out) {
  RETURN_IF_ERROR(DeclareAll(
      out, {{"meshrun_telemetry_step", MetricType::kGauge,
             "Step of the job's latest global summary."},
            {"meshrun_telemetry_step_time_seconds", MetricType::kGauge,
             "Step time of the latest global summary (max over hosts)."},
            {"meshrun_telemetry_partial", MetricType::kGauge,
             "1 when the latest global summary missed some hosts."},
            {"meshrun_telemetry_tflops_per_device", MetricType::kGauge,
             "Achieved TFLOP/s per device at the latest summary (compiler FLOPs over step "
             "time); absent when the FLOPs are not known."},
            {"meshrun_telemetry_mfu", MetricType::kGauge,
             "Model FLOPs utilisation at the latest summary: achieved over the chip's bf16 "
             "peak; TPU compile targets only."},
            {"meshrun_telemetry_value", MetricType::kGauge,
             "Latest global value of each series element (row-major index)."},
            {"meshrun_telemetry_value_stat", MetricType::kGauge,
             "Min, max and mean of the latest value of large vector series."},
            {"meshrun_telemetry_threshold_exceeded", MetricType::kGauge,
             "1 when the series crossed its declared threshold at the latest "
             "summary."}}));
  ASSIGN_OR_RETURN(std::vector<telemetry::HistoryStore::JobInfo> jobs, history.ListJobs());
  for (const telemetry::HistoryStore::JobInfo& info : jobs) {
    if (info.summaries == 0) continue;
    absl::StatusOr<std::vector<v1::GlobalSummary>> latest =
        history.Read({.job_id = info.job_id, .since_step = info.latest_step, .limit = 1});
    if (!latest.ok() || latest->empty()) continue;  // pruned or removed since ListJobs
    RETURN_IF_ERROR(AddSummary(info.job_id, latest->front(), max_elements, out));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> DashboardMetrics(CoordinatorRpcHandler& handler,
                                             telemetry::HistoryStore& history,
                                             int max_elements_per_series) {
  telemetry::PrometheusText out;
  RETURN_IF_ERROR(AddBuildInfo(out));
  v1::ListJobsResponse jobs;
  RETURN_IF_ERROR(handler.ListJobs({}, &jobs));
  RETURN_IF_ERROR(AddInsecurePlaintext(out));
  RETURN_IF_ERROR(AddRefusals(out));
  RETURN_IF_ERROR(AddJobCounts(jobs, out));
  RETURN_IF_ERROR(AddJobs(jobs, out));
  RETURN_IF_ERROR(AddGoodput(jobs, out));
  RETURN_IF_ERROR(AddStepTimes(handler.telemetry().step_times(), out));
  v1::ListWorkersResponse workers;
  RETURN_IF_ERROR(handler.ListWorkers({}, &workers));
  RETURN_IF_ERROR(AddWorkers(workers, out));
  v1::GetMetricsResponse metrics;
  RETURN_IF_ERROR(handler.GetMetrics({}, &metrics));
  RETURN_IF_ERROR(AddWorkerMetrics(metrics, out));
  RETURN_IF_ERROR(AddDeviceMemory(handler, AliveHosts(workers), out));
  RETURN_IF_ERROR(AddLatestTelemetry(history, max_elements_per_series, out));
  return out.Render();
}

}  // namespace meshrun::services
