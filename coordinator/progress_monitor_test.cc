#include "coordinator/progress_monitor.h"

#include <gtest/gtest.h>

namespace meshrun::coordinator {
namespace {

class ProgressMonitorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto monitor = ProgressMonitor::Create({.hang_timeout = absl::Seconds(10), .clock = &clock_});
    ASSERT_TRUE(monitor.ok());
    monitor_ = std::move(*monitor);
  }
  FakeClock clock_;
  std::unique_ptr<ProgressMonitor> monitor_;
};

TEST_F(ProgressMonitorTest, NamesTheStoppedHostAndWhereTheOthersWait) {
  monitor_->StartJob("job-1", {"w-0", "w-1"});
  for (int step = 1; step <= 812; ++step) {
    clock_.Advance(absl::Milliseconds(100));
    monitor_->Report("w-0", "job-1", step, "compute");
    monitor_->Report("w-1", "job-1", step, "compute");
  }
  // w-1 is stopped (no more reports); w-0 finished 812 too and waits for it in the all-reduce.
  for (int i = 0; i < 9; ++i) {
    clock_.Advance(absl::Seconds(1));
    monitor_->Report("w-0", "job-1", 812, kPhaseGradientAllReduce);
    EXPECT_TRUE(monitor_->Overdue().empty()) << i;
  }
  clock_.Advance(absl::Seconds(1));
  std::vector<ProgressMonitor::Hang> hangs = monitor_->Overdue();
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0].job_id, "job-1");
  EXPECT_EQ(hangs[0].host, "w-1");
  EXPECT_EQ(hangs[0].error.rfind("w-1 made no progress since step 812 (no report for 10s); "
                                 "w-0 waits in the gradient all-reduce after step 812",
                                 0),
            0u)
      << hangs[0].error;
  EXPECT_TRUE(monitor_->Overdue().empty()) << "reported once";
}

TEST_F(ProgressMonitorTest, TheLowestStepStoppedFirstEvenWhileItStillReports) {
  monitor_->StartJob("job-2", {"a", "b", "c"});
  monitor_->Report("a", "job-2", 5, kPhaseGradientAllReduce);
  monitor_->Report("b", "job-2", 4, "compute");  // still heartbeats, stuck in its step 5
  monitor_->Report("c", "job-2", 5, kPhaseGradientAllReduce);
  clock_.Advance(absl::Seconds(10));
  monitor_->Report("a", "job-2", 5, kPhaseGradientAllReduce);
  monitor_->Report("b", "job-2", 4, "compute");
  monitor_->Report("c", "job-2", 5, kPhaseGradientAllReduce);
  std::vector<ProgressMonitor::Hang> hangs = monitor_->Overdue();
  ASSERT_EQ(hangs.size(), 1u);
  EXPECT_EQ(hangs[0].host, "b");
  EXPECT_NE(hangs[0].error.find("b made no progress since step 4 (in compute)"),
            std::string::npos) << hangs[0].error;
  EXPECT_NE(hangs[0].error.find("a waits in the gradient all-reduce after step 5"),
            std::string::npos);
}

TEST_F(ProgressMonitorTest, ProgressOfAnyHostKeepsTheJobAliveAndEndedJobsAreForgotten) {
  monitor_->StartJob("job-3", {"a", "b"});
  for (int step = 1; step <= 5; ++step) {
    clock_.Advance(absl::Seconds(6));
    monitor_->Report("a", "job-3", step, "compute");
    monitor_->Report("x", "job-3", 100, "compute");       // not a host of the job: ignored
    monitor_->Report("a", "job-unknown", 100, "compute");  // not watched: ignored
    EXPECT_TRUE(monitor_->Overdue().empty());
  }
  monitor_->EndJob("job-3");
  clock_.Advance(absl::Hours(1));
  EXPECT_TRUE(monitor_->Overdue().empty());
}

TEST(ProgressMonitorConfigTest, OffByDefaultAndRefusesBadConfig) {
  FakeClock clock;
  auto off = ProgressMonitor::Create({.clock = &clock});
  ASSERT_TRUE(off.ok());
  (*off)->StartJob("j", {"a"});
  clock.Advance(absl::Hours(1));
  EXPECT_TRUE((*off)->Overdue().empty());
  EXPECT_EQ(ProgressMonitor::Create({.hang_timeout = absl::Seconds(-1), .clock = &clock})
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ProgressMonitor::Create({.hang_timeout = absl::Seconds(1), .clock = nullptr})
                .status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meshrun::coordinator
