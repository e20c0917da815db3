#include "coordinator/coordinator_telemetry.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "coordinator/worker_registry.h"

namespace meshrun::services {
namespace {

v1::HostSummary Host(const std::string& host, int64_t step, float loss) {
  v1::HostSummary s;
  s.set_job_id("job-7");
  s.set_host(host);
  s.set_step(step);
  s.set_replica_count(1);
  v1::TelemetryValue* v = s.add_values();
  v->set_name("loss");
  v->add_values(loss);
  return s;
}

class CoordinatorTelemetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = ::testing::TempDir() + "coordinator_telemetry_test.XXXXXX";
    ASSERT_NE(mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    job_.set_job_id("job-7");
    (*job_.mutable_host_incarnations())["a"] = "ia";
    (*job_.mutable_host_incarnations())["b"] = "ib";
    job_.mutable_mesh()->add_shape(2);
    v1::TelemetryDeclaration* d = job_.mutable_spec()->add_telemetry();
    d->set_name("loss");
    d->set_combine(v1::COMBINE_MEAN);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<CoordinatorTelemetry> Open() {
    auto t = CoordinatorTelemetry::Create({.database = dir_ + "/telemetry.db"});
    EXPECT_TRUE(t.ok()) << t.status();
    return t.ok() ? std::move(*t) : nullptr;
  }

  std::string dir_;
  v1::JobManifest job_;
};

// Acknowledgements: a summary is acknowledged once its step is committed, through its host's
// route, not when it arrives. A coordinator that stops mid-job (no EndJob) with step 20 half
// reported never acknowledged a's step 20, so a resends it: the next coordinator resumes the
// job and emits step 20 once, complete, when b's summary arrives; resent summaries of committed
// steps are acknowledged at once and change nothing.
TEST_F(CoordinatorTelemetryTest, AcksFollowCommitsAndRestartResumesWithoutDuplicates) {
  {
    auto first = Open();
    ASSERT_TRUE(first->DeclareJob("job-7", job_.spec()).ok());
    ASSERT_TRUE(first->StartJob(job_).ok());
    absl::Mutex mu;
    std::vector<std::string> acks;  // "host job step"
    for (const char* host : {"a", "b"}) {
      first->RouteAcks(host, [&, host = std::string(host)](const std::string& job, int64_t step) {
        absl::MutexLock lock(&mu);
        acks.push_back(absl::StrCat(host, " ", job, " ", step));
      });
    }
    const auto acked = [&] {
      absl::MutexLock lock(&mu);
      return acks;
    };
    EXPECT_EQ(*first->Accept(Host("a", 10, 1.0f)), std::nullopt);  // step 10 waits for b
    EXPECT_TRUE(acked().empty());
    EXPECT_EQ(*first->Accept(Host("b", 10, 1.0f)), std::nullopt);
    // The step's commit acknowledges both hosts (on the thread that delivered it).
    for (int i = 0; i < 200 && acked().size() < 2; ++i) absl::SleepFor(absl::Milliseconds(10));
    EXPECT_EQ(acked(), (std::vector<std::string>{"a job-7 10", "b job-7 10"}));
    EXPECT_EQ(*first->Accept(Host("a", 20, 2.0f)), std::nullopt);  // pending: not acknowledged
    EXPECT_EQ(*first->Accept(Host("b", 10, 1.0f)), 10);  // a resent committed step: at once
    absl::SleepFor(absl::Milliseconds(100));
    EXPECT_EQ(acked().size(), 2u);
    EXPECT_EQ(*first->history().PersistedThroughStep("job-7", "a"), 10);
  }
  auto second = Open();
  auto watcher = second->hub().Subscribe({.job_id = "job-7", .since_step = 1});
  ASSERT_TRUE(watcher.ok()) << watcher.status();
  // The workers resend what they did not see acknowledged, and more.
  EXPECT_EQ(*second->Accept(Host("b", 10, 1.0f)), 10);
  EXPECT_EQ(*second->Accept(Host("a", 20, 2.0f)), std::nullopt);
  EXPECT_EQ(*second->Accept(Host("b", 20, 4.0f)), std::nullopt);
  EXPECT_EQ(*second->Accept(Host("a", 20, 9.0f)), 20);  // committed: the first copy won
  std::vector<v1::GlobalSummary> got;
  for (int i = 0; i < 2; ++i) {
    auto item = (*watcher)->Pop(absl::Seconds(10));
    ASSERT_EQ(item.kind, telemetry::Watcher::Kind::kItem) << item.status;
    got.push_back(*item.summary);
  }
  EXPECT_EQ(got[0].step(), 10);
  EXPECT_EQ(got[1].step(), 20);
  EXPECT_FALSE(got[1].partial());
  EXPECT_FLOAT_EQ(got[1].values(0).values(0), 3.0f);  // mean of a's 2 and b's 4

  // The restarted coordinator's job table does not know the job: it ends with its hosts.
  EXPECT_FALSE(second->HostEnded("job-unknown", "a"));
  EXPECT_TRUE(second->HostEnded("job-7", "a"));
  EXPECT_EQ((*watcher)->TryPop().kind, telemetry::Watcher::Kind::kEmpty);
  EXPECT_TRUE(second->HostEnded("job-7", "b"));
  auto end = (*watcher)->Pop(absl::Seconds(10));
  ASSERT_EQ(end.kind, telemetry::Watcher::Kind::kEnd);
  EXPECT_TRUE(end.status.ok()) << end.status;
  second.reset();
  // Ended: a third start resumes nothing.
  auto third = Open();
  EXPECT_TRUE(absl::IsNotFound(third->Accept(Host("a", 30, 1.0f)).status()));
}

// Late telemetry from a fenced incarnation (issue 18, partitions): once the registry declares
// host a's incarnation DEAD (no heartbeat for the timeout, e.g. its link was cut), a summary it
// sends after the heal is refused through the coordinator's own fence and nothing of it is
// stored; so is one from the incarnation after a fresh one replaced it, and one that leaves the
// incarnation out. The live host's summaries still pass.
TEST_F(CoordinatorTelemetryTest, LateSummaryOfADeadIncarnationIsRefusedAndNotStored) {
  FakeClock clock;
  auto registry = coordinator::WorkerRegistry::Create(
      {.heartbeat_timeout = absl::Seconds(10), .clock = &clock});
  ASSERT_TRUE(registry.ok()) << registry.status();
  for (const char* host : {"a", "b"}) {
    ASSERT_TRUE((*registry)
                    ->Register({.host = host, .address = std::string(host) + ":1",
                                .incarnation = std::string("i") + host})
                    .ok());
  }
  auto t = CoordinatorTelemetry::Create(
      {.database = dir_ + "/telemetry.db",
       .admit = CoordinatorTelemetry::RegistryFence(registry->get())});
  ASSERT_TRUE(t.ok()) << t.status();
  CoordinatorTelemetry& telemetry = **t;
  ASSERT_TRUE(telemetry.DeclareJob("job-7", job_.spec()).ok());
  ASSERT_TRUE(telemetry.StartJob(job_).ok());
  const auto from = [](const std::string& host, const std::string& incarnation, int64_t step) {
    v1::HostSummary s = Host(host, step, 1.0f);
    s.set_incarnation(incarnation);
    return s;
  };
  ASSERT_TRUE(telemetry.Accept(from("a", "ia", 1)).ok());
  ASSERT_TRUE(telemetry.Accept(from("b", "ib", 1)).ok());

  // a goes silent; b keeps heartbeating. After the timeout a is DEAD.
  clock.Advance(absl::Seconds(6));
  ASSERT_TRUE((*registry)->Heartbeat("b", "ib").ok());
  clock.Advance(absl::Seconds(5));
  ASSERT_TRUE((*registry)->Heartbeat("b", "ib").ok());
  auto late = telemetry.Accept(from("a", "ia", 2));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kFailedPrecondition) << late.status();
  EXPECT_NE(late.status().message().find("DEAD"), std::string::npos) << late.status();
  EXPECT_TRUE(telemetry.Accept(from("b", "ib", 2)).ok());

  // Healed, a registers afresh: the old incarnation stays fenced, and leaving it out is no way
  // around the fence.
  ASSERT_TRUE((*registry)->Register({.host = "a", .address = "a:1", .incarnation = "ia2"}).ok());
  EXPECT_EQ(telemetry.Accept(from("a", "ia", 3)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(telemetry.Accept(from("a", "", 3)).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Nothing of a's refused summaries was stored: its history ends at step 1, b's goes on (its
  // step 2 is committed, partial, when the job ends).
  telemetry.EndJob("job-7");
  EXPECT_EQ(*telemetry.history().PersistedThroughStep("job-7", "a"), 1);
  EXPECT_EQ(*telemetry.history().PersistedThroughStep("job-7", "b"), 2);
  auto stored = telemetry.history().ReadHostSummaries("job-7", 1);
  ASSERT_TRUE(stored.ok()) << stored.status();
  for (const v1::HostSummary& s : *stored) EXPECT_EQ(s.host(), "b") << s.ShortDebugString();
  EXPECT_EQ(telemetry.LatestStep("job-7"), 2);  // from b; a's refused step 3 counts nowhere
}

// limits (--job_retention): a pruned job's telemetry is gone (watch, history, saved manifest)
// but its id stays known, so a restarted coordinator does not reuse it.
TEST_F(CoordinatorTelemetryTest, ForgetJobDropsItsHistoryButNotItsId) {
  {
    auto telemetry = Open();
    ASSERT_TRUE(telemetry->DeclareJob("job-7", job_.spec()).ok());
    ASSERT_TRUE(telemetry->StartJob(job_).ok());
    for (const char* host : {"a", "b"}) ASSERT_TRUE(telemetry->Accept(Host(host, 10, 1.0f)).ok());
    ASSERT_TRUE(telemetry->history().SaveJob("job-7", job_.SerializeAsString()).ok());
    telemetry->EndJob("job-7");
    ASSERT_TRUE(telemetry->history().LatestStep("job-7").ok());
    ASSERT_TRUE(telemetry->ForgetJob("job-7", 7).ok());
    EXPECT_TRUE(absl::IsNotFound(telemetry->hub().Subscribe({.job_id = "job-7"}).status()));
    EXPECT_TRUE(absl::IsNotFound(telemetry->history().LatestStep("job-7").status()));
    EXPECT_TRUE(absl::IsNotFound(telemetry->history().Series("job-7").status()));
    EXPECT_TRUE(telemetry->history().SavedJobs()->empty());
    EXPECT_EQ(telemetry->LatestStep("job-7"), 0);
    ASSERT_TRUE(telemetry->ForgetJob("job-3", 3).ok());  // a lower id keeps the highest
  }
  auto reopened = Open();
  EXPECT_EQ(*reopened->KnownJobs(), std::vector<std::string>{"job-7"});
}

}  // namespace
}  // namespace meshrun::services
