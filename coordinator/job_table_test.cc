#include "coordinator/job_table.h"

#include <gtest/gtest.h>

#include <map>
#include <vector>

namespace meshrun::coordinator {

using jobspec::IsFinal;
using jobspec::JobStateName;
namespace {

using v1::JobState;

std::unique_ptr<JobTable> NewTable(FakeClock* clock) {
  return JobTable::Create({.clock = clock}).value();
}

TEST(JobTableTest, EveryMoveOfTheStateMachine) {
  const std::vector<JobState> states = {
      v1::JOB_STATE_PENDING, v1::JOB_STATE_ASSIGNED,  v1::JOB_STATE_LOADING,
      v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED, v1::JOB_STATE_FAILED,
      v1::JOB_STATE_CANCELLED};
  // legal[from][to], in the order above.
  const bool legal[7][7] = {
      {0, 1, 0, 0, 0, 1, 1}, {0, 0, 1, 0, 0, 1, 1}, {0, 0, 0, 1, 0, 1, 1},
      {0, 0, 0, 0, 1, 1, 1}, {0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0},
      {0, 0, 0, 0, 0, 0, 0}};
  FakeClock clock;
  for (int from = 0; from < 7; ++from) {
    for (int to = 0; to < 7; ++to) {
      auto table = NewTable(&clock);
      const std::string id = table->Add(v1::JobSpec());
      // Walk the happy path to `from`; FAILED and CANCELLED are reached from PENDING.
      for (int step = 1; step <= (from > 4 ? 0 : from); ++step) {
        ASSERT_TRUE(table->Transition(id, states[step]).ok());
      }
      if (from > 4) {
        ASSERT_TRUE(table->Transition(id, states[from]).ok());
      }
      const absl::Status status = table->Transition(id, states[to]);
      EXPECT_EQ(status.ok(), legal[from][to])
          << JobStateName(states[from]) << " -> " << JobStateName(states[to]) << ": " << status;
      EXPECT_EQ(table->Get(id)->state(), legal[from][to] ? states[to] : states[from]);
      if (!status.ok()) {
        EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
        EXPECT_NE(status.message().find(JobStateName(states[from])), absl::string_view::npos);
      }
    }
  }
}

// What the telemetry checks ask for every summary: one host's entries, not the job's maps.
TEST(JobTableTest, OneHostsIncarnationAndRelay) {
  FakeClock clock;
  auto table = NewTable(&clock);
  const std::string id = table->Add(v1::JobSpec());
  ASSERT_TRUE(table
                  ->Update(id, [](v1::JobManifest& m) {
                    (*m.mutable_host_incarnations())["h0"] = "i0";
                    (*m.mutable_host_incarnations())["h1"] = "i1";
                    (*m.mutable_telemetry_relays())["h1"] = "h0";
                  })
                  .ok());
  EXPECT_EQ(table->HostIncarnation(id, "h1").value(), "i1");
  EXPECT_EQ(table->HostIncarnation(id, "h9").value(), std::nullopt);  // not a member
  EXPECT_EQ(table->TelemetryRelayOf(id, "h1").value(), "h0");
  EXPECT_EQ(table->TelemetryRelayOf(id, "h0").value(), "");  // uploads its own
  EXPECT_TRUE(absl::IsNotFound(table->HostIncarnation("job-999", "h1").status()));
  EXPECT_TRUE(absl::IsNotFound(table->TelemetryRelayOf("job-999", "h1").status()));
}

TEST(JobTableTest, FailureNamesHostAndErrorAndStampsTime) {
  FakeClock clock;
  auto table = NewTable(&clock);
  const std::string id = table->Add(v1::JobSpec());
  EXPECT_EQ(id, "job-1");
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(table->Fail(id, "host-b", "step 7: out of memory").ok());
  const v1::JobManifest job = table->Get(id).value();
  EXPECT_EQ(job.failed_host(), "host-b");
  EXPECT_EQ(job.error(), "step 7: out of memory");
  EXPECT_EQ(job.finished_unix_micros() - job.created_unix_micros(), 3000000);
  EXPECT_EQ(table->Cancel(id).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table->Get("job-99").status().code(), absl::StatusCode::kNotFound);
}

TEST(JobTableTest, DeadWorkerFailsOnlyItsIncarnationsUnfinishedJobs) {
  FakeClock clock;
  auto table = NewTable(&clock);
  const std::string running = table->Add(v1::JobSpec());
  const std::string other = table->Add(v1::JobSpec());
  const std::string finished = table->Add(v1::JobSpec());
  for (const std::string& id : {running, other, finished}) {
    ASSERT_TRUE(table->Transition(id, v1::JOB_STATE_ASSIGNED).ok());
  }
  ASSERT_TRUE(table->Update(running, [](v1::JobManifest& m) {
    (*m.mutable_host_incarnations())["a"] = "a1";
  }).ok());
  ASSERT_TRUE(table->Update(other, [](v1::JobManifest& m) {
    (*m.mutable_host_incarnations())["a"] = "a0";  // an older incarnation of the same host
  }).ok());
  ASSERT_TRUE(table->Update(finished, [](v1::JobManifest& m) {
    (*m.mutable_host_incarnations())["a"] = "a1";
  }).ok());
  ASSERT_TRUE(table->Cancel(finished).ok());

  EXPECT_EQ(table->FailJobsOnWorker("a", "a1", "worker a (incarnation a1) is DEAD"),
            std::vector<std::string>{running});
  EXPECT_EQ(table->Get(running)->failed_host(), "a");
  EXPECT_EQ(table->Get(other)->state(), v1::JOB_STATE_ASSIGNED);
  EXPECT_EQ(table->Get(finished)->state(), v1::JOB_STATE_CANCELLED);
  ASSERT_EQ(table->List().size(), 3u);
  EXPECT_EQ(table->List()[0].job_id(), running);
}

TEST(JobTableTest, EveryChangeIsSavedAndARestartTakesTheJobsBack) {
  FakeClock clock;
  std::map<std::string, v1::JobManifest> saved;
  int saves = 0;
  auto table = *JobTable::Create({.clock = &clock, .on_change = [&](const v1::JobManifest& job) {
                                    saved[job.job_id()] = job;
                                    ++saves;
                                  }});
  const std::string running = table->Add(v1::JobSpec());
  const std::string loading = table->Add(v1::JobSpec());
  const std::string done = table->Add(v1::JobSpec());
  for (v1::JobState state : {v1::JOB_STATE_ASSIGNED, v1::JOB_STATE_LOADING, v1::JOB_STATE_RUNNING}) {
    ASSERT_TRUE(table->Transition(running, state).ok());
  }
  ASSERT_TRUE(table->Transition(loading, v1::JOB_STATE_ASSIGNED).ok());
  ASSERT_TRUE(table->Transition(loading, v1::JOB_STATE_LOADING).ok());
  ASSERT_TRUE(table->Update(running, [](v1::JobManifest& m) { m.set_last_step(7); }).ok());
  ASSERT_TRUE(table->Fail(done, "host-a", "boom").ok());
  EXPECT_EQ(saves, 3 + 3 + 2 + 1 + 1);
  EXPECT_EQ(saved[running].last_step(), 7);
  EXPECT_FALSE(table->Transition(done, v1::JOB_STATE_RUNNING).ok());  // refused: nothing saved
  EXPECT_EQ(saves, 10);

  // The restart: the running job goes on, the interrupted launch fails, ids continue.
  clock.Advance(absl::Minutes(1));
  std::vector<v1::JobManifest> restored;
  for (const auto& [id, job] : saved) restored.push_back(RestoredAfterRestart(job, clock.Now()));
  auto again = *JobTable::Create({.clock = &clock, .restored = restored});
  EXPECT_EQ(again->Get(running)->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(again->Get(running)->last_step(), 7);
  EXPECT_EQ(again->Get(loading)->state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(again->Get(loading)->error(),
            "the coordinator restarted while the job was LOADING; resubmit it");
  EXPECT_EQ(again->Get(done)->error(), "boom");
  ASSERT_EQ(again->List().size(), 3u);
  EXPECT_EQ(again->List()[0].job_id(), running);  // submission order
  EXPECT_EQ(again->Add(v1::JobSpec()), "job-4");
  EXPECT_TRUE(again->Transition(running, v1::JOB_STATE_SUCCEEDED).ok());

  v1::JobManifest bad;
  bad.set_job_id("elsewhere-1");
  EXPECT_EQ(JobTable::Create({.clock = &clock, .restored = {bad}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// limits: finished jobs leave the table after --job_retention, and past --max_finished_jobs
// the earliest finished go first; unfinished jobs stay whatever their age.
TEST(JobTableTest, PruneFinishedByAgeThenByCount) {
  FakeClock clock;
  auto table = NewTable(&clock);
  const std::string running = table->Add(v1::JobSpec());
  ASSERT_TRUE(table->Transition(running, v1::JOB_STATE_ASSIGNED).ok());
  std::vector<std::string> done;
  for (int i = 0; i < 4; ++i) {
    done.push_back(table->Add(v1::JobSpec()));
    ASSERT_TRUE(table->Cancel(done.back()).ok());
    clock.Advance(absl::Hours(1));
  }
  // Finished 4 h, 3 h, 2 h and 1 h ago.
  EXPECT_TRUE(table->PruneFinished(absl::ZeroDuration(), 0).empty());
  EXPECT_TRUE(table->PruneFinished(absl::Hours(5), 10).empty());
  EXPECT_EQ(table->PruneFinished(absl::Minutes(150), 0),
            (std::vector<std::string>{done[0], done[1]}));
  EXPECT_EQ(table->PruneFinished(absl::Hours(24), 1), (std::vector<std::string>{done[2]}));
  EXPECT_TRUE(absl::IsNotFound(table->Get(done[0]).status()));
  std::vector<std::string> listed;
  for (const v1::JobManifest& job : table->List()) listed.push_back(job.job_id());
  EXPECT_EQ(listed, (std::vector<std::string>{running, done[3]}));
  clock.Advance(absl::Hours(1000));
  EXPECT_EQ(table->PruneFinished(absl::Hours(1), 0), (std::vector<std::string>{done[3]}));
  EXPECT_TRUE(table->Get(running).ok());
  EXPECT_EQ(table->Add(v1::JobSpec()), "job-6");  // ids are never reused
}

}  // namespace
}  // namespace meshrun::coordinator
