// The coordinator's Prometheus text (exposition 0.0.4) behind GET /metrics, as plain logic:
// the build, jobs by state and each job's state, progress, goodput and step-time histogram,
// the registry's workers, the workers' own metrics and device memory, and each job's latest
// global telemetry. DashboardApi (dashboard_api.h) routes GET /metrics here.
//
// Thread-safety: safe to call concurrently; it only reads through the handler and history.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "telemetry/history_store.h"

namespace meshrun::services {

class CoordinatorRpcHandler;

// One scrape. A worker that cannot answer is left out of it. Vector series with more elements
// than `max_elements_per_series` are exported as min/max/mean rather than one sample per
// element. Errors: those of the handler's ListJobs, ListWorkers and GetMetrics and of the
// history's ListJobs, unchanged; INVALID_ARGUMENT when a worker's metric name makes an
// invalid or clashing family.
absl::StatusOr<std::string> DashboardMetrics(CoordinatorRpcHandler& handler,
                                             telemetry::HistoryStore& history,
                                             int max_elements_per_series);

}  // namespace meshrun::services
