// Goodput from a job's state timestamps, compile time, checkpoint blocking and the step times of
// its summaries, including a rewind's re-run steps and a job restarted by automatic recovery.
#include "coordinator/goodput.h"

#include <gtest/gtest.h>

#include "coordinator/job_table.h"

namespace meshrun::coordinator {
namespace {

constexpr int64_t kStart = 1'000'000'000'000'000;  // unix micros

v1::GlobalSummary Summary(int64_t step, double seconds, double wall_after_start) {
  v1::GlobalSummary s;
  s.set_job_id("job-1");
  s.set_step(step);
  s.set_step_time_seconds(seconds);
  s.set_wall_time_unix_micros(kStart + static_cast<int64_t>(wall_after_start * 1e6));
  return s;
}

v1::JobManifest Job() {
  v1::JobManifest job;
  job.set_job_id("job-1");
  job.set_created_unix_micros(kStart);
  auto& entered = *job.mutable_state_entered_unix_micros();
  entered["PENDING"] = kStart;
  entered["ASSIGNED"] = kStart + 2'000'000;  // 2 s waiting for hosts
  entered["LOADING"] = kStart + 5'000'000;   // compile 2.5 s of the 3 s assigned
  entered["RUNNING"] = kStart + 6'000'000;   // 1 s transferring executables
  job.set_compile_seconds(2.5);
  job.set_finished_unix_micros(kStart + 20'000'000);
  v1::CheckpointRecord* c = job.add_checkpoints();
  c->set_blocking_seconds(0.25);
  return job;
}

TEST(GoodputTest, EveryStepSummarized) {
  StepTimes times;
  // Init takes 2 s after RUNNING (6 s): step 1 starts at 8 s; 10 steps of 1 s each.
  for (int s = 1; s <= 10; ++s) times.Add(Summary(s, 1.0, 8.0 + s));
  v1::JobManifest job = Job();
  FillGoodput(times, absl::Now(), &job);
  const v1::JobGoodput& g = job.goodput();
  EXPECT_DOUBLE_EQ(g.wall_seconds(), 20);
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 10);
  EXPECT_DOUBLE_EQ(g.ratio(), 0.5);
  EXPECT_DOUBLE_EQ(g.badput_seconds().at("waiting_for_hosts"), 2);
  EXPECT_DOUBLE_EQ(g.badput_seconds().at("compile"), 2.5);
  EXPECT_DOUBLE_EQ(g.badput_seconds().at("executable_transfer"), 1);
  EXPECT_NEAR(g.badput_seconds().at("init"), 2, 1e-9);
  EXPECT_DOUBLE_EQ(g.badput_seconds().at("checkpoint_blocking"), 0.25);
  // 20 - 10 - 2 - 2.5 - 1 - 2 - 0.25
  EXPECT_NEAR(g.badput_seconds().at("other"), 2.25, 1e-9);
}

TEST(GoodputTest, CadenceAndRewind) {
  StepTimes times;
  // A summary every 10 steps, 0.5 s per step; steps 1..30 then a rewind to step 21 (restored
  // from the checkpoint at 20): steps 21..30 are computed twice.
  for (int s = 10; s <= 30; s += 10) times.Add(Summary(s, 0.5, 7.0 + 0.5 * s));
  for (int s = 30; s <= 40; s += 10) times.Add(Summary(s, 0.5, 20.0 + 0.5 * s));
  auto timing = times.Get("job-1");
  ASSERT_TRUE(timing.has_value());
  EXPECT_EQ(timing->last_step, 40);
  EXPECT_EQ(timing->samples, 4);  // 10, 20, the new 30, 40
  v1::JobManifest job = Job();
  job.set_finished_unix_micros(kStart + 60'000'000);
  const v1::JobGoodput g = ComputeGoodput(job, &*timing, absl::Now());
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 20);  // 40 steps of 0.5 s, each once
  EXPECT_DOUBLE_EQ(g.badput_seconds().at("rerun_steps"), 0.5);  // one sampled step lost
  EXPECT_NEAR(g.ratio(), 20.0 / 60.0, 1e-12);
}

TEST(GoodputTest, DataWaitIsBadputNotProductive) {
  StepTimes times;
  // 10 steps of 1 s, each waiting 0.25 s for its batch; step 5's wait is dropped by a rewind to
  // step 5 whose re-run waits 0.5 s. A wait past its step counts as the whole step.
  for (int s = 1; s <= 5; ++s) {
    v1::GlobalSummary summary = Summary(s, 1.0, 8.0 + s);
    summary.set_data_wait_seconds(0.25);
    times.Add(summary);
  }
  for (int s = 5; s <= 10; ++s) {
    v1::GlobalSummary summary = Summary(s, 1.0, 9.0 + s);
    summary.set_data_wait_seconds(s == 5 ? 0.5 : s == 10 ? 7.0 : 0.25);
    times.Add(summary);
  }
  v1::JobManifest job = Job();
  FillGoodput(times, absl::Now(), &job);
  const v1::JobGoodput& g = job.goodput();
  // Waits: 4 x 0.25 + 0.5 + 4 x 0.25 + 1.0 (capped) = 3.5 over 10 steps of 1 s.
  EXPECT_NEAR(g.badput_seconds().at("data_wait"), 3.5, 1e-9);
  EXPECT_NEAR(g.productive_seconds(), 6.5, 1e-9);
  EXPECT_NEAR(g.ratio(), 6.5 / 20, 1e-9);
}

TEST(GoodputTest, ResumedJobCountsFromItsRestoredStep) {
  StepTimes times;
  for (int s = 101; s <= 110; ++s) times.Add(Summary(s, 1.0, 10.0 + (s - 100)));
  v1::JobManifest job = Job();
  job.set_restored_step(100);
  FillGoodput(times, absl::Now(), &job);
  EXPECT_DOUBLE_EQ(job.goodput().productive_seconds(), 10);
  EXPECT_NEAR(job.goodput().badput_seconds().at("restore"), 4, 1e-9);  // 6 s -> 10 s
  EXPECT_EQ(job.goodput().badput_seconds().count("init"), 0);
}

TEST(GoodputTest, StepTimeHistogramCountsEverySummaryOnce) {
  StepTimes times;
  EXPECT_TRUE(times.Histograms().empty());
  // Two summaries of 0.5 s, then a rewind re-running step 2 in 3 s: three observations.
  times.Add(Summary(1, 0.5, 9));
  times.Add(Summary(2, 0.5, 10));
  times.Add(Summary(2, 3.0, 14));
  const auto histograms = times.Histograms();
  ASSERT_EQ(histograms.size(), 1u);
  const telemetry::Histogram& h = histograms.at("job-1");
  EXPECT_EQ(h.count(), 3u);
  EXPECT_DOUBLE_EQ(h.sum(), 4.0);
  const std::vector<double>& bounds = h.upper_bounds();
  const std::vector<uint64_t> cumulative = h.CumulativeCounts();
  for (size_t i = 0; i < bounds.size(); ++i) {
    EXPECT_EQ(cumulative[i], bounds[i] < 0.5 ? 0u : bounds[i] < 3.0 ? 2u : 3u) << bounds[i];
  }
}

TEST(GoodputTest, NoStepYet) {
  StepTimes times;
  v1::JobManifest job = Job();
  job.clear_finished_unix_micros();
  FillGoodput(times, absl::FromUnixMicros(kStart + 4'000'000), &job);
  EXPECT_DOUBLE_EQ(job.goodput().wall_seconds(), 4);
  EXPECT_DOUBLE_EQ(job.goodput().ratio(), 0);
}

// Sum of a goodput's badput, every cause but "other" (which fills up to the wall time).
double Badput(const v1::JobGoodput& g) {
  double sum = 0;
  for (const auto& [cause, seconds] : g.badput_seconds()) {
    if (cause != "other") sum += seconds;
  }
  return sum;
}

TEST(GoodputTest, RestartAddsUpTheRunsWithinWallTime) {
  FakeClock clock;
  auto table = JobTable::Create({.clock = &clock}).value();
  StepTimes times;
  const absl::Time t0 = clock.Now();
  auto at = [&](double seconds) { return t0 + absl::Seconds(seconds); };
  auto summary = [&](int64_t step, double wall) {
    v1::GlobalSummary s;
    s.set_job_id("job-1");
    s.set_step(step);
    s.set_step_time_seconds(1.0);
    s.set_wall_time_unix_micros(absl::ToUnixMicros(at(wall)));
    times.Add(s);
  };
  auto move = [&](double seconds, v1::JobState to) {
    clock.Advance(at(seconds) - clock.Now());
    ASSERT_TRUE(table->Transition("job-1", to).ok());
  };
  v1::JobSpec spec;
  spec.mutable_checkpoint()->set_directory("/ck");
  ASSERT_EQ(table->Add(spec), "job-1");
  // Run 1: 2 s waiting, compile 1 s of 1.5 s assigned, 0.5 s transfer, 1 s init, then steps
  // 1..50 of 1 s each; a host dies at 56 s. The checkpoint of step 30 is the newest.
  move(2, v1::JOB_STATE_ASSIGNED);
  ASSERT_TRUE(table->Update("job-1", [](v1::JobManifest& m) { m.set_compile_seconds(1); }).ok());
  move(3.5, v1::JOB_STATE_LOADING);
  move(4, v1::JOB_STATE_RUNNING);
  for (int s = 1; s <= 50; ++s) summary(s, 5 + s);
  ASSERT_TRUE(table->Update("job-1", [](v1::JobManifest& m) { m.set_last_step(50); }).ok());
  clock.Advance(at(56) - clock.Now());
  ASSERT_TRUE(table->Restart("job-1", "host-b", "host-b is DEAD", "/ck/30", 30, 0).ok());
  // Waiting for hosts again: 4 s into the wait, the wait counts, run 1's time does not.
  v1::JobManifest waiting = *table->Get("job-1");
  FillGoodput(times, at(60), &waiting);
  EXPECT_DOUBLE_EQ(waiting.goodput().badput_seconds().at("waiting_for_hosts"), 2 + 4);
  EXPECT_LE(Badput(waiting.goodput()), waiting.goodput().wall_seconds());
  // Run 2: 10 s waiting, a cache hit (no compile), 0.5 s transfer, 2 s restore, then steps
  // 31..100; the job ends 1 s after its last step.
  move(66, v1::JOB_STATE_ASSIGNED);
  move(66.5, v1::JOB_STATE_LOADING);
  move(67, v1::JOB_STATE_RUNNING);
  for (int s = 31; s <= 100; ++s) summary(s, 69 + (s - 30));
  move(140, v1::JOB_STATE_SUCCEEDED);
  v1::JobManifest job = *table->Get("job-1");
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).start_step(), 0);
  EXPECT_DOUBLE_EQ(job.attempts(0).badput_seconds().at("waiting_for_hosts"), 2);
  EXPECT_DOUBLE_EQ(job.attempts(0).badput_seconds().at("compile"), 1);
  FillGoodput(times, absl::InfiniteFuture(), &job);
  const v1::JobGoodput& g = job.goodput();
  EXPECT_DOUBLE_EQ(g.wall_seconds(), 140);
  EXPECT_DOUBLE_EQ(g.productive_seconds(), 100);  // steps 1..100, each once
  EXPECT_DOUBLE_EQ(g.badput_seconds().at("waiting_for_hosts"), 12);
  EXPECT_DOUBLE_EQ(g.badput_seconds().at("compile"), 1);
  EXPECT_DOUBLE_EQ(g.badput_seconds().at("executable_transfer"), 1);
  EXPECT_NEAR(g.badput_seconds().at("restore"), 2, 1e-9);
  EXPECT_DOUBLE_EQ(g.badput_seconds().at("rerun_steps"), 20);  // steps 31..50 of run 1
  EXPECT_LE(Badput(g) + g.productive_seconds(), g.wall_seconds() + 1e-9);
  // Run 1's init, its idle second, the compile slack and the end: 4 s.
  EXPECT_NEAR(g.badput_seconds().at("other"), 4, 1e-9);
}

}  // namespace
}  // namespace meshrun::coordinator
