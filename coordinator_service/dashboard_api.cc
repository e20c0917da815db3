#include "coordinator_service/dashboard_api.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <limits>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/types/span.h"
#include "common/status_macros.h"
#include "coordinator_service/coordinator_rpc_handler.h"
#include "coordinator_service/dashboard_metrics.h"
#include "jobspec/job_states.h"

namespace meshrun::services {
namespace {

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
absl::Status CheckParams(const HttpRequest& request, absl::Span<const char* const> allowed) {
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
        absl::StrCat(name, " is \"", value, "\"; give a non-negative integer"));
  }
  return n;
}

// ------------------------------------------------------------------------------- handlers

absl::StatusOr<std::string> Metrics(const DashboardApi::Config& config, const HttpRequest&) {
  return DashboardMetrics(*config.handler, *config.history, config.max_elements_per_series);
}

absl::StatusOr<std::string> Jobs(const DashboardApi::Config& config, const HttpRequest&) {
  v1::ListJobsResponse jobs;
  RETURN_IF_ERROR(config.handler->ListJobs({}, &jobs));
  return ToJson(jobs);
}

absl::StatusOr<std::string> Job(const DashboardApi::Config& config, const HttpRequest& request) {
  v1::GetJobRequest get;
  ASSIGN_OR_RETURN(*get.mutable_job_id(), Required(request, "id"));
  v1::JobManifest job;
  RETURN_IF_ERROR(config.handler->GetJob(get, &job));
  return ToJson(job);
}

// ListWorkers' paging and filters as query parameters: page_size, page_token, state (alive,
// dead, left), slice, on_job.
absl::StatusOr<std::string> Workers(const DashboardApi::Config& config,
                                    const HttpRequest& request) {
  v1::ListWorkersRequest list;
  for (const auto& [name, value] : request.params) {
    if (name == "page_size") {
      ASSIGN_OR_RETURN(int64_t size, NonNegative("page_size", value));
      list.set_page_size(static_cast<int32_t>(std::min<int64_t>(size, 100000)));
    } else if (name == "page_token") {
      list.set_page_token(value);
    } else if (name == "state") {
      std::optional<v1::WorkerState> state = jobspec::ParseWorkerState(value);
      if (!state) {
        return absl::InvalidArgumentError(
            absl::StrCat("state is \"", value, "\"; give alive, dead or left"));
      }
      list.set_state(*state);
    } else if (name == "slice") {
      ASSIGN_OR_RETURN(int64_t slice, NonNegative("slice", value));
      list.set_slice_id(static_cast<int32_t>(std::min<int64_t>(slice, 1 << 30)));
    } else if (name == "on_job") {
      list.set_on_job_id(value);
    }
  }
  v1::ListWorkersResponse workers;
  RETURN_IF_ERROR(config.handler->ListWorkers(list, &workers));
  return ToJson(workers);
}

absl::StatusOr<std::string> Memory(const DashboardApi::Config& config,
                                   const HttpRequest& request) {
  v1::GetDeviceMemoryRequest get;
  ASSIGN_OR_RETURN(*get.mutable_host(), Required(request, "host"));
  v1::GetDeviceMemoryResponse memory;
  RETURN_IF_ERROR(config.handler->GetDeviceMemory(get, &memory));
  return ToJson(memory);
}

absl::StatusOr<std::string> Series(const DashboardApi::Config& config,
                                   const HttpRequest& request) {
  ASSIGN_OR_RETURN(std::string job, Required(request, "job"));
  ASSIGN_OR_RETURN(std::vector<v1::TelemetryDeclaration> series, config.history->Series(job));
  std::vector<std::string> items;
  for (const v1::TelemetryDeclaration& declaration : series) items.push_back(ToJson(declaration));
  return absl::StrCat("{\"job_id\":", JsonString(job), ",\"series\":[",
                      absl::StrJoin(items, ","), "]}");
}

// ------------------------------------------------------------------------------- routes

constexpr char kJson[] = "application/json";
constexpr char kPrometheus[] = "text/plain; version=0.0.4; charset=utf-8";

// One row per endpoint Handle answers: adding an endpoint is a handler above and a row here.
// A request must match a row's method and path exactly; a query parameter outside `params` is
// refused (400, named) before the handler runs. Who may call an endpoint is decided before
// routing, by the HTTP access control (rpc/http_auth.cc: role view for every path, role
// metrics also for /metrics); GET /api/watch, a stream, is served by HttpServer through
// OpenWatch.
struct Route {
  std::string_view method;
  std::string_view path;
  std::vector<const char*> params;  // the query parameters it takes
  const char* content_type;
  absl::StatusOr<std::string> (*handler)(const DashboardApi::Config&, const HttpRequest&);
};

const std::vector<Route>& Routes() {
  static const auto* routes = new std::vector<Route>{
      {"GET", "/metrics", {}, kPrometheus, &Metrics},
      {"GET", "/api/jobs", {}, kJson, &Jobs},
      {"GET", "/api/job", {"id"}, kJson, &Job},
      {"GET", "/api/workers", {"page_size", "page_token", "state", "slice", "on_job"}, kJson,
       &Workers},
      {"GET", "/api/memory", {"host"}, kJson, &Memory},
      {"GET", "/api/series", {"job"}, kJson, &Series},
  };
  return *routes;
}

// A HEAD is answered as its GET (the HTTP layer drops the body).
const Route* FindRoute(const HttpRequest& request) {
  std::string_view method = request.method;
  if (method == "HEAD") method = "GET";
  for (const Route& route : Routes()) {
    if (route.method == method && route.path == request.path) return &route;
  }
  return nullptr;
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
  const Route* route = FindRoute(request);
  if (route == nullptr) {
    return ErrorResponse(absl::NotFoundError(absl::StrCat(
        "no such path ", request.path,
        "; try / (the dashboard), /metrics, /api/jobs, /api/workers")));
  }
  if (absl::Status valid = CheckParams(request, route->params); !valid.ok()) {
    return ErrorResponse(valid);
  }
  absl::StatusOr<std::string> body = route->handler(config_, request);
  if (!body.ok()) return ErrorResponse(body.status());
  return {.content_type = route->content_type, .body = *std::move(body)};
}

HttpResponse DashboardApi::ErrorResponse(const absl::Status& status) {
  return {.status = HttpCode(status),
          .body = absl::StrCat("{\"error\":", JsonString(std::string(status.message())), "}\n")};
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
  // A step past the history is refused below (the hub's Subscribe); the largest int64 is
  // refused here, since the step after it does not exist (it wrapped to the whole history).
  if (!request.last_event_id.empty()) {
    ASSIGN_OR_RETURN(int64_t last, NonNegative("Last-Event-ID", request.last_event_id));
    if (last == std::numeric_limits<int64_t>::max()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Last-Event-ID is ", last, ", past any step; give the id of the last event seen"));
    }
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

}  // namespace meshrun::services
