// The coordinator's side of the commit protocol on real files: a checkpoint commits only when
// every host of the same run reported, a report from a run that ended in a restart is refused
// (a surviving host keeps its incarnation), and Forget drops a run's pending reports and
// removes its uncommitted temp directories.
#include "coordinator/checkpoint_commits.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/store.h"

namespace meshrun::coordinator {
namespace {

namespace fs = std::filesystem;

class CheckpointCommitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / "checkpoint_commits_test").string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    v1::JobSpec spec;
    spec.mutable_checkpoint()->set_directory(dir_);
    job_ = table_->Add(spec);
    Book();
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Books hosts a and b (the same incarnations every run: both survive) and runs the job.
  void Book() {
    ASSERT_TRUE(table_->Update(job_, [](v1::JobManifest& m) {
                         (*m.mutable_host_incarnations())["a"] = "inc-a";
                         (*m.mutable_host_incarnations())["b"] = "inc-b";
                       }).ok());
    for (v1::JobState to : {v1::JOB_STATE_ASSIGNED, v1::JOB_STATE_LOADING,
                            v1::JOB_STATE_RUNNING}) {
      ASSERT_TRUE(table_->Transition(job_, to).ok());
    }
  }
  void Restart(int runs_before) {
    ASSERT_TRUE(table_->Restart(job_, "b", "b failed", checkpoint::StepDir(dir_, 10), 10,
                                runs_before, {})
                    .ok());
    Book();
  }

  // Host `host` of run `attempt` writes its half of array state.w ([4] f32, chunks of 2) for
  // `step`, filled with `value`, into the step's temp directory, and reports it.
  absl::Status Write(const std::string& host, int attempt, int64_t step, float value) {
    checkpoint::ArrayChunks entry;
    entry.array.set_name("state.w");
    entry.array.set_leaf("w");
    entry.array.set_dtype("f32");
    entry.array.add_shape(4);
    entry.array.add_chunk_shape(2);
    entry.chunks.push_back({host == "a" ? "0" : "1",
                            runtime::HostArray::From(runtime::DType::kF32, {2},
                                                     std::vector<float>{value, value})});
    auto written = checkpoint::WriteChunks(checkpoint::TempStepDir(dir_, step), {entry});
    if (!written.ok()) return written.status();
    v1::ReportCheckpointRequest report;
    report.set_job_id(job_);
    report.set_host(host);
    report.set_incarnation("inc-" + host);
    report.set_attempt(attempt);
    report.set_step(step);
    for (v1::CheckpointArray& array : *written) *report.add_arrays() = std::move(array);
    return commits_.Report(report);
  }

  FakeClock clock_;
  std::unique_ptr<JobTable> table_ = JobTable::Create({.clock = &clock_}).value();
  CheckpointCommits commits_{table_.get()};
  std::string dir_;
  std::string job_;
};

TEST_F(CheckpointCommitsTest, EveryHostOfTheRunCommits) {
  ASSERT_TRUE(Write("a", 0, 10, 1).ok());
  EXPECT_EQ(commits_.pending(), 1u);
  EXPECT_FALSE(fs::exists(checkpoint::StepDir(dir_, 10)));
  ASSERT_TRUE(Write("b", 0, 10, 2).ok());
  EXPECT_EQ(commits_.pending(), 0u);
  auto manifest = checkpoint::ReadManifest(checkpoint::StepDir(dir_, 10));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  auto w = checkpoint::ReadArray(checkpoint::StepDir(dir_, 10), manifest->arrays(0));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->As<float>(), (std::vector<float>{1, 1, 2, 2}));
  EXPECT_TRUE(table_->Get(job_)->checkpoints(0).committed());
}

// A preempted run may end only once its step settled: Pending holds from the first host's
// report until the commit is recorded, for that run alone.
TEST_F(CheckpointCommitsTest, PendingHoldsUntilTheLastHostsReportCommitted) {
  EXPECT_FALSE(commits_.Pending(job_, 0));
  ASSERT_TRUE(Write("a", 0, 10, 1).ok());
  EXPECT_TRUE(commits_.Pending(job_, 0));
  EXPECT_FALSE(commits_.Pending(job_, 1));
  EXPECT_FALSE(commits_.Pending("job-other", 0));
  ASSERT_TRUE(Write("b", 0, 10, 2).ok());
  EXPECT_FALSE(commits_.Pending(job_, 0));
  EXPECT_TRUE(table_->Get(job_)->checkpoints(0).committed());
}

// The old run's host a reported step 40, then the job restarted (both hosts kept their
// incarnations); the new run's host b reporting step 40 must not complete the old run's
// commit with a's old chunk sha256s.
TEST_F(CheckpointCommitsTest, AnOldRunsReportNeverCompletesTheNewRunsCommit) {
  ASSERT_TRUE(Write("a", 0, 40, 1).ok());
  Restart(0);
  // No Forget here: the keying alone keeps the runs apart.
  ASSERT_TRUE(Write("b", 1, 40, 3).ok());
  EXPECT_FALSE(fs::exists(checkpoint::StepDir(dir_, 40))) << "committed with run 1's report";
  EXPECT_EQ(table_->Get(job_)->checkpoints_size(), 0);
  ASSERT_TRUE(Write("a", 1, 40, 4).ok());  // the new run's a: now complete
  auto manifest = checkpoint::ReadManifest(checkpoint::StepDir(dir_, 40));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  auto w = checkpoint::ReadArray(checkpoint::StepDir(dir_, 40), manifest->arrays(0));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->As<float>(), (std::vector<float>{4, 4, 3, 3}));
}

TEST_F(CheckpointCommitsTest, AStaleRunsReportIsRefusedNamingTheRun) {
  Restart(0);
  const absl::Status late = Write("a", 0, 20, 1);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
  EXPECT_EQ(late.message(),
            "the checkpoint of step 20 is from run 1 of job " + job_ +
                ", which restarted since (now run 2); it is not committed");
  EXPECT_EQ(commits_.pending(), 0u);
}

TEST_F(CheckpointCommitsTest, ForgetDropsPendingReportsAndTheirTempDirectories) {
  ASSERT_TRUE(Write("a", 0, 10, 1).ok());
  ASSERT_TRUE(Write("b", 0, 10, 2).ok());  // committed: Forget must keep it
  ASSERT_TRUE(Write("a", 0, 20, 1).ok());  // b dies before it reports
  ASSERT_EQ(commits_.pending(), 1u);
  ASSERT_TRUE(fs::exists(checkpoint::TempStepDir(dir_, 20)));
  Restart(0);
  commits_.Forget(job_);
  EXPECT_EQ(commits_.pending(), 0u);
  EXPECT_FALSE(fs::exists(checkpoint::TempStepDir(dir_, 20)));
  EXPECT_TRUE(fs::exists(checkpoint::StepDir(dir_, 10)));
  // The manifest lists each checkpoint: committed, or why not.
  const v1::JobManifest job = table_->Get(job_).value();
  ASSERT_EQ(job.checkpoints_size(), 2);
  EXPECT_TRUE(job.checkpoints(0).committed());
  EXPECT_EQ(job.checkpoints(1).step(), 20);
  EXPECT_FALSE(job.checkpoints(1).committed());
  EXPECT_EQ(job.checkpoints(1).error(),
            "not committed: the run ended before every host reported it (no report from b)");
  // After the job ended, no report is taken (and nothing stays pending).
  ASSERT_TRUE(table_->Fail(job_, "a", "gone").ok());
  EXPECT_EQ(Write("a", 1, 30, 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(commits_.pending(), 0u);
}

}  // namespace
}  // namespace meshrun::coordinator
