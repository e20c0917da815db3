// One scale run (issue 30): a real meshrun-coordinator process and a FakeFleet of `hosts`
// stand-in TPU hosts, taken through registration, idle heartbeats, the launch of one job that
// spans every host, and `steps` logging steps of telemetry read back by one watcher. The
// coordinator's CPU is read from /proc around each phase, so the figures are the
// coordinator's own, not the fleet's. Used by bench/scale_bench.cc and tests/scale_load_test.cc.
//
// Thread-safety: RunAtScale may run one at a time per process (it raises the process's open
// file limit and spawns a child). Errors: what failed to start or answer, named.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace meshrun::test_support {

struct ScaleOptions {
  std::string bin_dir;     // holds meshrun-coordinator
  std::string source_dir;  // the repository: the job is examples/mlp_classifier/dp8, dp auto
  int hosts = 16;
  int devices_per_host = 4;
  int steps = 10;                             // logging steps, cadence 1
  absl::Duration step_period = absl::Seconds(1);
  absl::Duration idle = absl::Seconds(3);  // beats alone, to price one (an interval at least)
  absl::Duration launch_timeout = absl::Seconds(120);
  int64_t executable_bytes = 64 << 10;
  std::vector<std::string> coordinator_flags;  // e.g. "--heartbeat_timeout=60s"
  bool unary_heartbeats = false;  // a Heartbeat call per beat, not a stream per host (baseline)
};

struct ScaleFigures {
  int hosts = 0;
  // Registration and idle liveness.
  double register_cpu_per_host_ms = 0;
  double rss_mib_registered = 0;
  double heartbeat_cpu_per_beat_us = 0;
  double heartbeat_core_share = 0;  // of one core, while idle
  // The launch.
  std::string job_state;            // after the launch ("RUNNING" when it worked)
  std::string job_error;
  double submit_to_running_s = 0;
  double loading_to_running_s = 0;
  int peak_threads = 0;             // the coordinator's, during the launch
  double rss_mib_launched = 0;
  int64_t start_job_bytes_per_host = 0;  // mean over hosts
  int64_t start_job_max_bytes = 0;
  double worst_heartbeat_launch_s = 0;   // round trip, during the launch
  // Telemetry.
  int64_t global_summaries = 0;     // read by the watcher
  int64_t summary_breaks = 0;       // steps the watcher saw out of order or missing
  double telemetry_cpu_per_step_ms = 0;
  double telemetry_cpu_per_summary_us = 0;  // per host summary, idle CPU taken out
  double summary_latency_p50_ms = 0;        // last host summary sent -> global summary read
  double summary_latency_p99_ms = 0;
  double worst_heartbeat_telemetry_s = 0;
  // One GetMetrics of every host (the dashboard's and Prometheus' scrape), after the launch.
  double metrics_scrape_ms = 0;      // the median of three
  double metrics_scrape_cpu_ms = 0;  // the coordinator's, per scrape
  // Over the whole run.
  int64_t heartbeat_errors = 0;     // beats refused (a host the coordinator forgot)
  int64_t hosts_not_alive = 0;      // after the telemetry phase, by ListWorkers
  int64_t summaries_refused = 0;
  std::string fleet_error;          // the fleet's last refusal, if any
};

absl::StatusOr<ScaleFigures> RunAtScale(const ScaleOptions& options);

// One line of the figures, for logs and the bench's table.
std::string DescribeFigures(const ScaleFigures& figures);

}  // namespace meshrun::test_support
