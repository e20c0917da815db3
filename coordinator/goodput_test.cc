// Goodput partitions a job's wall time: state times, checkpoint blocking and the completion
// times of its summarized steps, across a cadence, a resume and a restart by automatic recovery.
#include "coordinator/goodput.h"

#include <gtest/gtest.h>

#include <random>

#include "coordinator/job_table.h"

namespace meshrun::coordinator {
namespace {

constexpr int64_t kStart = 1'000'000'000'000'000;  // unix micros

absl::Time At(double seconds) { return absl::FromUnixMicros(kStart + std::llround(seconds * 1e6)); }

v1::GlobalSummary Summary(int64_t step, double seconds, double done_at, double data_wait = 0) {
  v1::GlobalSummary s;
  s.set_job_id("job-1");
  s.set_step(step);
  s.set_step_time_seconds(seconds);
  s.set_data_wait_seconds(data_wait);
  s.set_wall_time_unix_micros(absl::ToUnixMicros(At(done_at)));
  return s;
}

v1::JobManifest Job() {
  v1::JobManifest job;
  job.set_job_id("job-1");
  job.mutable_spec()->add_telemetry()->set_name("loss");
  job.set_created_unix_micros(kStart);
  auto& entered = *job.mutable_state_entered_unix_micros();
  entered["PENDING"] = kStart;
  entered["ASSIGNED"] = kStart + 2'000'000;  // 2 s waiting for hosts
  entered["LOADING"] = kStart + 5'000'000;   // 3 s compiling
  entered["RUNNING"] = kStart + 6'000'000;   // 1 s transferring executables
  job.set_finished_unix_micros(kStart + 20'000'000);
  return job;
}

// productive + every cause, which must be the wall time.
double Accounted(const v1::JobGoodput& g) {
  double sum = g.productive_seconds();
  for (const auto& [cause, seconds] : g.badput_seconds()) sum += seconds;
  return sum;
}

TEST(GoodputTest, EveryStepSummarized) {
  StepTimes times;
  // Init takes 2 s after RUNNING (6 s): step 1 starts at 8 s; 10 steps of 1 s each, done at
  // 9..18 s; the checkpoint of step 5 blocks step 6 for 0.25 s; 2 s of shutdown.
  for (int s = 1; s <= 10; ++s) times.Add(Summary(s, 1.0, 8.0 + s));
  v1::JobManifest job = Job();
  v1::CheckpointRecord* c = job.add_checkpoints();
  c->set_step(5);
  c->set_blocking_seconds(0.25);
  FillGoodput(times, absl::Now(), &job);
  const v1::JobGoodput& g = job.goodput();
  EXPECT_DOUBLE_EQ(g.wall_seconds(), 20);
  EXPECT_NEAR(g.productive_seconds(), 9.75, 1e-9);
  EXPECT_NEAR(g.ratio(), 9.75 / 20, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("waiting_for_hosts"), 2, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("compile"), 3, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("executable_transfer"), 1, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("init"), 2, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("checkpoint_blocking"), 0.25, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("other"), 2, 1e-9);
  EXPECT_NEAR(Accounted(g), 20, 1e-9);
}

TEST(GoodputTest, OverlappingStepTimesCountTheWallClockOnce) {
  // The step loop launches step s before awaiting s-1, so each step's own time (done - start)
  // spans two steps' wall time: 10 steps done 1 s apart, each reporting 2 s. Productive time is
  // the wall clock between completions, not the sum of the reported times.
  StepTimes times;
  for (int s = 1; s <= 10; ++s) times.Add(Summary(s, 2.0, 8.0 + s));
  v1::JobManifest job = Job();
  FillGoodput(times, absl::Now(), &job);
  const v1::JobGoodput& g = job.goodput();
  // The first step counts at its 2 s (from 7 s), the 9 after it 1 s each.
  EXPECT_NEAR(g.productive_seconds(), 11, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("init"), 1, 1e-9);
  EXPECT_NEAR(Accounted(g), 20, 1e-9);
}

TEST(GoodputTest, CadenceAndDataWait) {
  StepTimes times;
  // A summary every 10 steps at 0.5 s per step, from 7 s: done at 12, 17, 22, 27 s. The
  // summary of step 20 waited 0.1 s for its batch: its 10 steps count 1 s of data wait; the
  // summary of step 40 says 0.6 s, past the interval's share, so the wait is capped at it.
  times.Add(Summary(10, 0.5, 12));
  times.Add(Summary(20, 0.5, 17, 0.1));
  times.Add(Summary(30, 0.5, 22));
  times.Add(Summary(40, 0.5, 27, 0.6));
  v1::JobManifest job = Job();
  job.set_finished_unix_micros(kStart + 30'000'000);
  FillGoodput(times, absl::Now(), &job);
  const v1::JobGoodput& g = job.goodput();
  EXPECT_NEAR(g.badput_seconds().at("init"), 1, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("data_wait"), 1 + 5, 1e-9);  // 0.6 s clamped to 0.5 a step
  EXPECT_NEAR(g.productive_seconds(), 20 - 6, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("other"), 3, 1e-9);
  EXPECT_NEAR(Accounted(g), 30, 1e-9);
}

TEST(GoodputTest, ResumedJobCountsFromItsRestoredStep) {
  StepTimes times;
  for (int s = 101; s <= 110; ++s) times.Add(Summary(s, 1.0, 10.0 + (s - 100)));
  v1::JobManifest job = Job();
  job.set_restored_step(100);
  FillGoodput(times, absl::Now(), &job);
  EXPECT_NEAR(job.goodput().productive_seconds(), 10, 1e-9);
  EXPECT_NEAR(job.goodput().badput_seconds().at("restore"), 4, 1e-9);  // 6 s -> 10 s
  EXPECT_EQ(job.goodput().badput_seconds().count("init"), 0);
}

TEST(GoodputTest, StepTimeHistogramCountsEverySummaryOnce) {
  StepTimes times;
  EXPECT_TRUE(times.Histograms().empty());
  // Two summaries of 0.5 s, then a repeated step 2 of 3 s: three observations, two samples.
  times.Add(Summary(1, 0.5, 9));
  times.Add(Summary(2, 0.5, 10));
  times.Add(Summary(2, 3.0, 14));
  EXPECT_EQ(times.RunSamples("job-1").size(), 2u);
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

TEST(GoodputTest, RunningJobWithoutAStepYet) {
  StepTimes times;
  v1::JobManifest job = Job();
  job.clear_finished_unix_micros();
  FillGoodput(times, At(8), &job);
  EXPECT_DOUBLE_EQ(job.goodput().wall_seconds(), 8);
  EXPECT_DOUBLE_EQ(job.goodput().ratio(), 0);
  EXPECT_NEAR(job.goodput().badput_seconds().at("init"), 2, 1e-9);  // RUNNING since 6 s
  EXPECT_NEAR(Accounted(job.goodput()), 8, 1e-9);
}

TEST(GoodputTest, RestartPartitionsEachRun) {
  FakeClock clock;
  clock.Advance(At(0) - clock.Now());
  auto table = JobTable::Create({.clock = &clock}).value();
  StepTimes times;
  auto move = [&](double seconds, v1::JobState to) {
    clock.Advance(At(seconds) - clock.Now());
    ASSERT_TRUE(table->Transition("job-1", to).ok());
  };
  v1::JobSpec spec;
  spec.mutable_checkpoint()->set_directory("/ck");
  spec.add_telemetry()->set_name("loss");
  ASSERT_EQ(table->Add(spec), "job-1");
  // Run 1: 2 s waiting, 1.5 s compiling, 0.5 s transfer, 1 s init, then steps 1..50 of 1 s
  // each, done at 6..55 s; a host dies at 56 s. The checkpoint of step 30 is the newest.
  move(2, v1::JOB_STATE_ASSIGNED);
  move(3.5, v1::JOB_STATE_LOADING);
  move(4, v1::JOB_STATE_RUNNING);
  times.StartRun("job-1");
  for (int s = 1; s <= 50; ++s) times.Add(Summary(s, 1.0, 5 + s));
  ASSERT_TRUE(table->Update("job-1", [](v1::JobManifest& m) { m.set_last_step(50); }).ok());
  clock.Advance(At(56) - clock.Now());
  ASSERT_TRUE(table->Restart("job-1", "host-b", "host-b is DEAD", "/ck/30", 30, 0,
                             times.RunSamples("job-1"))
                  .ok());
  {
    const v1::JobAttempt run = table->Get("job-1")->attempts(0);
    EXPECT_NEAR(run.badput_seconds().at("rerun_steps"), 20, 1e-9);  // steps 31..50
    EXPECT_NEAR(run.badput_seconds().at("failure"), 1, 1e-9);       // 55 s -> 56 s
    EXPECT_NEAR(run.badput_seconds().at("init"), 1, 1e-9);
  }
  // Waiting for hosts again: 4 s into the wait, the wait counts, run 1's time does not.
  v1::JobManifest waiting = *table->Get("job-1");
  FillGoodput(times, At(60), &waiting);
  EXPECT_NEAR(waiting.goodput().badput_seconds().at("waiting_for_hosts"), 2 + 4, 1e-9);
  EXPECT_NEAR(waiting.goodput().productive_seconds(), 30, 1e-9);
  EXPECT_NEAR(Accounted(waiting.goodput()), 60, 1e-9);
  // Run 2: 10 s waiting, 0.5 s compiling (a cache hit), 0.5 s transfer, 2 s restore, then
  // steps 31..100 done at 70..139 s; the job ends 1 s after its last step.
  move(66, v1::JOB_STATE_ASSIGNED);
  move(66.5, v1::JOB_STATE_LOADING);
  move(67, v1::JOB_STATE_RUNNING);
  times.StartRun("job-1");
  for (int s = 31; s <= 100; ++s) times.Add(Summary(s, 1.0, 69 + (s - 30)));
  move(140, v1::JOB_STATE_SUCCEEDED);
  v1::JobManifest job = *table->Get("job-1");
  ASSERT_EQ(job.attempts_size(), 1);
  EXPECT_EQ(job.attempts(0).start_step(), 0);
  FillGoodput(times, absl::InfiniteFuture(), &job);
  const v1::JobGoodput& g = job.goodput();
  EXPECT_DOUBLE_EQ(g.wall_seconds(), 140);
  EXPECT_NEAR(g.productive_seconds(), 100, 1e-9);  // steps 1..100, each once
  EXPECT_NEAR(g.badput_seconds().at("waiting_for_hosts"), 12, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("compile"), 2, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("executable_transfer"), 1, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("init"), 1, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("restore"), 2, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("rerun_steps"), 20, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("failure"), 1, 1e-9);
  EXPECT_NEAR(g.badput_seconds().at("other"), 1, 1e-9);
  EXPECT_NEAR(Accounted(g), 140, 1e-9);
}

TEST(GoodputTest, AnyTimelineAddsUpToTheWallTime) {
  // Random state times, summaries (some before RUNNING or past the end, as skewed host clocks
  // give), checkpoints and runs: every bucket is non-negative and they add up to the wall time.
  std::mt19937 rng(7);
  auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution(lo, hi)(rng); };
  for (int trial = 0; trial < 500; ++trial) {
    v1::JobManifest job = Job();
    auto& entered = *job.mutable_state_entered_unix_micros();
    double t = uniform(0, 3);
    entered.clear();
    for (const char* state : {"PENDING", "ASSIGNED", "LOADING", "RUNNING"}) {
      if (uniform(0, 1) < 0.05) break;
      entered[state] = absl::ToUnixMicros(At(t));
      t += uniform(0, 4);
    }
    job.set_restored_step(trial % 3 == 0 ? 20 : 0);
    std::vector<StepSample> steps;
    int64_t step = job.restored_step();
    double done = uniform(0, 10);
    for (int i = 0, n = trial % 40; i < n; ++i) {
      step += 1 + static_cast<int64_t>(uniform(0, 10));
      done += uniform(-0.5, 3);
      steps.push_back({.step = step, .done = At(done), .step_seconds = uniform(0, 4),
                       .data_wait_seconds = uniform(0, 1)});
    }
    for (int i = 0; i < 4; ++i) {
      v1::CheckpointRecord* c = job.add_checkpoints();
      c->set_step(static_cast<int64_t>(uniform(0, 300)));
      c->set_blocking_seconds(uniform(0, 5));
    }
    const double end = uniform(0, 120);
    job.set_finished_unix_micros(absl::ToUnixMicros(At(end)));
    if (trial % 4 == 1) {  // an ended run before this one
      const RunTime ended = PartitionRun(job, steps, At(0), At(end / 2), step / 2, true);
      v1::JobAttempt* run = job.add_attempts();
      run->set_end_unix_micros(absl::ToUnixMicros(At(end / 2)));
      double sum = ended.productive;
      for (const auto& [cause, seconds] : ended.badput) {
        ASSERT_GE(seconds, 0) << cause;
        sum += seconds;
        (*run->mutable_badput_seconds())[cause] = seconds;
      }
      ASSERT_NEAR(sum, end / 2, 1e-6) << trial;
    }
    const v1::JobGoodput g = ComputeGoodput(job, steps, absl::InfiniteFuture());
    ASSERT_GE(g.productive_seconds(), 0) << trial;
    for (const auto& [cause, seconds] : g.badput_seconds()) ASSERT_GE(seconds, 0) << cause;
    ASSERT_NEAR(Accounted(g), g.wall_seconds(), 1e-6) << trial;
    ASSERT_LE(g.ratio(), 1 + 1e-9) << trial;
  }
}

}  // namespace
}  // namespace meshrun::coordinator
