#include "coordinator/straggler_detector.h"

#include <gtest/gtest.h>

namespace meshrun::coordinator {
namespace {

using Hosts = std::vector<std::string>;

std::unique_ptr<StragglerDetector> Detector() {
  auto d = StragglerDetector::Create({.mad_factor = 3, .min_margin = 0.2, .consecutive = 3});
  EXPECT_TRUE(d.ok());
  return std::move(*d);
}

// One logging step: every host's time.
bool Step(StragglerDetector& d, int64_t step, const std::map<std::string, double>& times) {
  bool changed = false;
  for (const auto& [host, t] : times) changed = d.Observe("job", host, step, t) || changed;
  return changed;
}

TEST(StragglerDetectorTest, FlagsAHostSlowForKStepsAndClearsItWhenItRecovers) {
  auto d = Detector();
  d->StartJob("job", {"w-0", "w-1", "w-2", "w-3"});
  int64_t step = 0;
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(Step(*d, ++step, {{"w-0", 1.0}, {"w-1", 1.02}, {"w-2", 0.98}, {"w-3", 1.01}}));
  }
  EXPECT_FALSE(Step(*d, ++step, {{"w-0", 1.0}, {"w-1", 1.02}, {"w-2", 2.0}, {"w-3", 1.01}}));
  EXPECT_FALSE(Step(*d, ++step, {{"w-0", 1.0}, {"w-1", 1.02}, {"w-2", 2.0}, {"w-3", 1.01}}));
  EXPECT_TRUE(d->Flagged("job").empty()) << "2 slow steps are not yet K = 3";
  EXPECT_TRUE(Step(*d, ++step, {{"w-0", 1.0}, {"w-1", 1.02}, {"w-2", 2.0}, {"w-3", 1.01}}));
  EXPECT_EQ(d->Flagged("job"), Hosts{"w-2"});
  EXPECT_TRUE(Step(*d, ++step, {{"w-0", 1.0}, {"w-1", 1.02}, {"w-2", 1.0}, {"w-3", 1.01}}));
  EXPECT_TRUE(d->Flagged("job").empty());
}

TEST(StragglerDetectorTest, NoiseWithinTheMarginIsNotAStraggler) {
  auto d = Detector();
  d->StartJob("job", {"a", "b"});  // two hosts: the peer's MAD is 0, the margin decides
  for (int64_t step = 1; step <= 20; ++step) {
    Step(*d, step, {{"a", 1.0}, {"b", step % 2 ? 1.15 : 0.9}});
  }
  EXPECT_TRUE(d->Flagged("job").empty());
  for (int64_t step = 21; step <= 23; ++step) Step(*d, step, {{"a", 1.0}, {"b", 1.5}});
  EXPECT_EQ(d->Flagged("job"), Hosts{"b"});
}

TEST(StragglerDetectorTest, AStepIsJudgedOnlyWhenEveryHostReportedIt) {
  auto d = Detector();
  d->StartJob("job", {"a", "b", "c"});
  for (int64_t step = 1; step <= 5; ++step) {
    EXPECT_FALSE(d->Observe("job", "a", step, 1.0));
    EXPECT_FALSE(d->Observe("job", "b", step, 9.0));  // c never reports
  }
  EXPECT_TRUE(d->Flagged("job").empty());
  EXPECT_FALSE(d->Observe("other", "a", 1, 1.0));
  EXPECT_FALSE(d->Observe("job", "stranger", 1, 1.0));
  d->EndJob("job");
  EXPECT_TRUE(d->Flagged("job").empty());
}

TEST(StragglerDetectorTest, RefusesBadConfig) {
  EXPECT_FALSE(StragglerDetector::Create({.consecutive = 0}).ok());
  EXPECT_FALSE(StragglerDetector::Create({.mad_factor = -1}).ok());
  EXPECT_FALSE(StragglerDetector::Create({.min_margin = -0.1}).ok());
}

}  // namespace
}  // namespace meshrun::coordinator
