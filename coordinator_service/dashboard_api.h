// What the coordinator's HTTP port answers, as plain logic (no HTTP library, no gRPC types):
// Prometheus text at /metrics, JSON under /api/ for the web dashboard, and the watchers behind
// its server-sent-event stream. coordinator_service/http_server.h is the thin adapter that serves it.
//
//   GET /metrics                         Prometheus text exposition 0.0.4
//   GET /api/jobs                        every job's manifest (without program bytes)
//   GET /api/job?id=J                    one manifest
//   GET /api/workers                     the registry: workers, states, heartbeats, and the
//                                        matches by slice; ?page_size=N&page_token=T a page,
//                                        ?state=alive|dead|left&slice=S&on_job=J filters
//   GET /api/memory?host=H               that worker's device memory
//   GET /api/series?job=J                the job's declared telemetry series
//   GET /api/watch?job=J&since_step=N    server-sent events: one `summary` event per global
//                                        summary (id = step), backfilled from history then
//                                        live; a Last-Event-ID header resumes after that step
//
// Errors map to HTTP codes: a missing, unknown or malformed query parameter is 400 and names
// the parameter; an unknown path, job or host is 404; a worker that cannot answer is 503.
//
// Lifetime: the handler and history store given in Config must outlive the api and every
// watcher it opened. Thread-safety: every method is safe to call concurrently.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "meshrun/v1/telemetry.pb.h"
#include "telemetry/history_store.h"
#include "telemetry/watch_hub.h"

namespace meshrun::services {

class CoordinatorRpcHandler;

struct HttpRequest {
  std::string path;
  std::map<std::string, std::string> params;  // the query string, decoded
  std::string last_event_id;                  // the Last-Event-ID header, if any
  std::string method = "GET";
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

class DashboardApi {
 public:
  struct Config {
    CoordinatorRpcHandler* handler = nullptr;      // required
    telemetry::HistoryStore* history = nullptr;    // required
    // Vector series with more elements than this are exported to Prometheus as min/max/mean
    // rather than one sample per element, so label cardinality stays bounded.
    int max_elements_per_series = 64;
  };

  // Errors: INVALID_ARGUMENT (a required pointer is null).
  static absl::StatusOr<std::unique_ptr<DashboardApi>> Create(Config config);

  // Answers a GET of /metrics or /api/* (not /api/watch) through the route table in
  // dashboard_api.cc (method + path -> handler, one row per endpoint); unknown paths are 404.
  // Never fails: errors come back as a status code with {"error": "..."}.
  HttpResponse Handle(const HttpRequest& request);

  // Opens the watcher behind GET /api/watch. Errors: INVALID_ARGUMENT (job missing,
  // since_step or Last-Event-ID not a non-negative integer, unknown parameter — named, or
  // since_step beyond the latest step + 1), NOT_FOUND (unknown job).
  absl::StatusOr<std::shared_ptr<telemetry::Watcher>> OpenWatch(const HttpRequest& request);

  // The server-sent event of one summary: "id: <step>\nevent: summary\ndata: <json>\n\n".
  static std::string SummaryEvent(const v1::GlobalSummary& summary);
  // The event that ends a stream: "event: end" with {"status": ..., "resume_step": N}.
  static std::string EndEvent(const absl::Status& status, int64_t resume_step);

  // The HTTP code for a status (400, 404, 409, 503, 504 or 500).
  static int HttpCode(const absl::Status& status);
  // That code with {"error": "<message>"}.
  static HttpResponse ErrorResponse(const absl::Status& status);

 private:
  explicit DashboardApi(Config config) : config_(config) {}

  const Config config_;
};

}  // namespace meshrun::services
