// A coordinator with 256 stand-in TPU hosts (testing/scale_run.h): every host registers, one job
// is launched across all of them and runs, its telemetry combines every host's summary, and no
// live host is declared dead or refused on the way; the StartJob each host receives stays small.
#include <gtest/gtest.h>

#include <cstdio>

#include "testing/scale_run.h"

namespace meshrun::test_support {
namespace {

TEST(ScaleLoadTest, LaunchesAndCombinesAcross256Hosts) {
  ScaleOptions options{.bin_dir = MESHRUN_BIN_DIR, .source_dir = MESHRUN_SOURCE_DIR};
  options.hosts = 256;
  options.steps = 8;
  options.step_period = absl::Milliseconds(500);
  options.idle = absl::Seconds(2);
  absl::StatusOr<ScaleFigures> figures = RunAtScale(options);
  ASSERT_TRUE(figures.ok()) << figures.status();
  const ScaleFigures& f = *figures;
  std::printf("%s\n", DescribeFigures(f).c_str());
  EXPECT_EQ(f.job_state, "RUNNING") << f.job_error;
  EXPECT_LT(f.submit_to_running_s, 20);
  EXPECT_EQ(f.heartbeat_errors, 0);
  EXPECT_EQ(f.hosts_not_alive, 0);
  EXPECT_EQ(f.summaries_refused, 0) << f.fleet_error;
  // Heartbeats are answered within a fraction of the 10 s timeout while the launch runs.
  EXPECT_LT(f.worst_heartbeat_launch_s, 2.0);
  // Every step's global summary arrives, in order.
  EXPECT_EQ(f.global_summaries, options.steps);
  EXPECT_EQ(f.summary_breaks, 0);
}

}  // namespace
}  // namespace meshrun::test_support
