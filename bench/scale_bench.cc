// Scale benchmark (issue 30): one coordinator process and N stand-in TPU hosts
// (testing/fake_fleet.h) for each N of --hosts, each run through registration, idle heartbeats,
// one launch across every host and --steps logging steps of telemetry (testing/scale_run.h).
// Prints one line of figures per N, then the ratios:
//   launch_bytes_linear: StartJob bytes per host at the smallest N of 64 or more, over those at
//     the largest N (1.0 when each host gets the same bytes whatever the fleet; 64 and 1024 in
//     the figure);
//   heartbeat_vs_goal: 50 us over the coordinator's CPU per heartbeat at the largest N;
//   telemetry_per_host_vs_goal: 20 us over the coordinator's CPU per host summary at the
//     largest N.
// Usage: meshrun_scale_bench <bin dir> <source dir> [--hosts=16,64,256,1024] [--steps=10]
//        [--step_period=1s] [--coordinator_flags=--heartbeat_timeout=10s,...]
//        [--unary_heartbeats] (the baseline: a Heartbeat call per beat, as before
//        StreamHeartbeats)
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "testing/scale_run.h"

ABSL_FLAG(std::vector<std::string>, hosts, std::vector<std::string>({"16", "64", "256", "1024"}),
          "fleet sizes, one run each");
ABSL_FLAG(int, steps, 10, "logging steps of telemetry (cadence 1)");
ABSL_FLAG(absl::Duration, step_period, absl::Seconds(1), "time between steps");
ABSL_FLAG(absl::Duration, idle, absl::Seconds(5), "heartbeats alone, to price one beat");
ABSL_FLAG(std::vector<std::string>, coordinator_flags, {},
          "flags for each coordinator, e.g. --heartbeat_timeout=10s");
ABSL_FLAG(bool, unary_heartbeats, false,
          "the fake hosts heartbeat by a Heartbeat call each, not on a stream each");

int main(int argc, char** argv) {
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 3) {
    std::fprintf(stderr, "usage: %s <bin dir> <source dir> [--hosts=16,64,256,1024]\n", args[0]);
    return 2;
  }
  std::vector<meshrun::test_support::ScaleFigures> runs;
  for (const std::string& n : absl::GetFlag(FLAGS_hosts)) {
    meshrun::test_support::ScaleOptions options{.bin_dir = args[1], .source_dir = args[2]};
    if (!absl::SimpleAtoi(n, &options.hosts) || options.hosts < 1) {
      std::fprintf(stderr, "--hosts: \"%s\" is not a host count\n", n.c_str());
      return 2;
    }
    options.steps = absl::GetFlag(FLAGS_steps);
    options.step_period = absl::GetFlag(FLAGS_step_period);
    options.idle = absl::GetFlag(FLAGS_idle);
    options.coordinator_flags = absl::GetFlag(FLAGS_coordinator_flags);
    options.unary_heartbeats = absl::GetFlag(FLAGS_unary_heartbeats);
    absl::StatusOr<meshrun::test_support::ScaleFigures> figures =
        meshrun::test_support::RunAtScale(options);
    if (!figures.ok()) {
      std::fprintf(stderr, "%d hosts: %s\n", options.hosts, figures.status().ToString().c_str());
      return 1;
    }
    std::printf("%s\n", meshrun::test_support::DescribeFigures(*figures).c_str());
    std::fflush(stdout);
    runs.push_back(*figures);
  }
  const meshrun::test_support::ScaleFigures* small = nullptr;
  const meshrun::test_support::ScaleFigures* large = &runs.front();
  for (const auto& run : runs) {
    if (run.hosts >= 64 && (small == nullptr || run.hosts < small->hosts)) small = &run;
    if (run.hosts > large->hosts) large = &run;
  }
  if (small != nullptr && small != large && large->start_job_bytes_per_host > 0) {
    std::printf("StartJob bytes per host: %lld at %d hosts, %lld at %d hosts\n",
                static_cast<long long>(small->start_job_bytes_per_host), small->hosts,
                static_cast<long long>(large->start_job_bytes_per_host), large->hosts);
    std::printf("ratio launch_bytes_linear %.4f\n",
                static_cast<double>(small->start_job_bytes_per_host) /
                    static_cast<double>(large->start_job_bytes_per_host));
  }
  std::printf("coordinator CPU per heartbeat at %d hosts: %.1f us (goal 50 us)\n", large->hosts,
              large->heartbeat_cpu_per_beat_us);
  std::printf("ratio heartbeat_vs_goal %.4f\n", 50.0 / large->heartbeat_cpu_per_beat_us);
  if (large->telemetry_cpu_per_summary_us > 0) {
    std::printf("coordinator CPU per host summary at %d hosts: %.1f us (goal 20 us)\n",
                large->hosts, large->telemetry_cpu_per_summary_us);
    std::printf("ratio telemetry_per_host_vs_goal %.4f\n",
                20.0 / large->telemetry_cpu_per_summary_us);
  }
  return 0;
}
