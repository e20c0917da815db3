#include "coordinator/worker_registry.h"

#include <gtest/gtest.h>

namespace meshrun::coordinator {
namespace {

WorkerInfo Worker(const std::string& host, const std::string& incarnation) {
  return WorkerInfo{.host = host, .address = host + ":7071", .incarnation = incarnation};
}

class WorkerRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto registry = WorkerRegistry::Create({.heartbeat_timeout = absl::Seconds(10), .clock = &clock_});
    ASSERT_TRUE(registry.ok());
    registry_ = std::move(*registry);
  }
  FakeClock clock_;
  std::unique_ptr<WorkerRegistry> registry_;
};

TEST_F(WorkerRegistryTest, HeartbeatsKeepAWorkerAliveAndSilenceKillsIt) {
  ASSERT_TRUE(registry_->Register(Worker("a", "a1")).ok());
  EXPECT_EQ(registry_->heartbeat_interval(), absl::Seconds(5));
  for (int i = 0; i < 5; ++i) {
    clock_.Advance(absl::Seconds(5));
    ASSERT_TRUE(registry_->Heartbeat("a", "a1").ok());
  }
  EXPECT_TRUE(registry_->ExpireOverdue().empty());
  clock_.Advance(absl::Seconds(10));
  EXPECT_TRUE(registry_->ExpireOverdue().empty()) << "exactly the timeout is still alive";
  clock_.Advance(absl::Milliseconds(1));
  std::vector<WorkerEntry> dead = registry_->ExpireOverdue();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].info.host, "a");
  EXPECT_NE(dead[0].state_reason.find("no heartbeat"), std::string::npos);
  EXPECT_TRUE(registry_->ExpireOverdue().empty()) << "reported once";
  EXPECT_EQ(registry_->Heartbeat("a", "a1").code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(WorkerRegistryTest, DeathNoticedByAnotherCallIsStillReportedOnce) {
  ASSERT_TRUE(registry_->Register(Worker("a", "a1")).ok());
  ASSERT_TRUE(registry_->Register(Worker("b", "b1")).ok());
  clock_.Advance(absl::Seconds(11));
  ASSERT_TRUE(registry_->Register(Worker("c", "c1")).ok());  // each of these sees the timeout
  EXPECT_EQ(registry_->List().size(), 3u);
  std::vector<WorkerEntry> dead = registry_->ExpireOverdue();
  ASSERT_EQ(dead.size(), 2u) << "deaths found by Register/List must not be lost";
  EXPECT_EQ(dead[0].info.host, "a");
  EXPECT_EQ(dead[1].info.host, "b");
  EXPECT_TRUE(registry_->ExpireOverdue().empty());
}

TEST_F(WorkerRegistryTest, NewIncarnationIsANewMemberAndTheOldOneDies) {
  ASSERT_TRUE(registry_->Register(Worker("a", "a1")).ok());
  ASSERT_TRUE(registry_->Register(Worker("a", "a2")).ok());
  std::vector<WorkerEntry> dead = registry_->ExpireOverdue();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].info.incarnation, "a1");
  EXPECT_EQ(registry_->Heartbeat("a", "a1").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(registry_->Heartbeat("a", "a2").ok());
  EXPECT_EQ(registry_->Register(Worker("a", "a1")).code(), absl::StatusCode::kAlreadyExists);
  ASSERT_EQ(registry_->List().size(), 1u);
  EXPECT_EQ(registry_->List()[0].info.incarnation, "a2");
}

TEST_F(WorkerRegistryTest, BadRegistrationNamesFieldAndChangesNothing) {
  WorkerInfo info = Worker("a", "a1");
  info.address.clear();
  const absl::Status status = registry_->Register(info);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("registration.address"), absl::string_view::npos);
  EXPECT_TRUE(registry_->List().empty());
  EXPECT_EQ(registry_->Heartbeat("nobody", "x").code(), absl::StatusCode::kNotFound);
}

TEST_F(WorkerRegistryTest, DeregisteredWorkerIsLeftNotDead) {
  ASSERT_TRUE(registry_->Register(Worker("b", "b1")).ok());
  ASSERT_TRUE(registry_->Register(Worker("a", "a1")).ok());
  ASSERT_TRUE(registry_->Deregister("a", "a1").ok());
  clock_.Advance(absl::Minutes(1));
  std::vector<WorkerEntry> dead = registry_->ExpireOverdue();
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].info.host, "b");
  std::vector<WorkerEntry> all = registry_->List();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].info.host, "a");  // sorted
  EXPECT_EQ(all[0].state, WorkerState::kLeft);
  EXPECT_EQ(all[1].state, WorkerState::kDead);
}

TEST_F(WorkerRegistryTest, AliveAddressesLeaveOutTheLeftTheDeadAndTheSilent) {
  ASSERT_TRUE(registry_->Register(Worker("a", "a1")).ok());
  ASSERT_TRUE(registry_->Register(Worker("b", "b1")).ok());
  ASSERT_TRUE(registry_->Register(Worker("c", "c1")).ok());
  ASSERT_TRUE(registry_->Deregister("b", "b1").ok());
  using Alive = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(registry_->AliveAddresses(), (Alive{{"a", "a:7071"}, {"c", "c:7071"}}));
  clock_.Advance(absl::Seconds(6));
  ASSERT_TRUE(registry_->Heartbeat("c", "c1").ok());
  clock_.Advance(absl::Seconds(5));  // a is silent past the timeout: it expires here
  EXPECT_EQ(registry_->AliveAddresses(), (Alive{{"c", "c:7071"}}));
  ASSERT_EQ(registry_->ExpireOverdue().size(), 1u) << "a's death is still reported";
}

}  // namespace
}  // namespace meshrun::coordinator

namespace meshrun::coordinator {
namespace {

// multihost: the fence telemetry uses (CoordinatorTelemetry's admit).
TEST_F(WorkerRegistryTest, ListsBySliceThenHostInNaturalOrder) {
  for (const char* host : {"worker-10", "worker-2", "worker-1"}) {
    ASSERT_TRUE(registry_->Register(Worker(host, std::string(host) + "-i")).ok());
  }
  WorkerInfo other_slice = Worker("worker-0", "worker-0-i");
  other_slice.slice_id = 1;
  other_slice.num_slices = 2;
  ASSERT_TRUE(registry_->Register(other_slice).ok());
  std::vector<std::string> hosts;
  for (const WorkerEntry& entry : registry_->List()) hosts.push_back(entry.info.host);
  EXPECT_EQ(hosts, (std::vector<std::string>{"worker-1", "worker-2", "worker-10", "worker-0"}));
}

TEST(WorkerRegistryFenceTest, OnlyTheCurrentAliveIncarnationPasses) {
  FakeClock clock;
  auto registry = WorkerRegistry::Create({.heartbeat_timeout = absl::Seconds(10), .clock = &clock});
  ASSERT_TRUE(registry.ok());
  WorkerInfo a{.host = "a", .address = "a:1", .incarnation = "a1"};
  ASSERT_TRUE((*registry)->Register(a).ok());
  EXPECT_TRUE((*registry)->CheckCurrent("a", "a1").ok());
  EXPECT_EQ((*registry)->CheckCurrent("b", "b1").code(), absl::StatusCode::kNotFound);
  clock.Advance(absl::Seconds(11));  // partitioned: declared DEAD
  EXPECT_EQ((*registry)->CheckCurrent("a", "a1").code(), absl::StatusCode::kFailedPrecondition);
  a.incarnation = "a2";  // healed: registers afresh; the old incarnation stays fenced
  ASSERT_TRUE((*registry)->Register(a).ok());
  EXPECT_TRUE((*registry)->CheckCurrent("a", "a2").ok());
  EXPECT_EQ((*registry)->CheckCurrent("a", "a1").code(), absl::StatusCode::kFailedPrecondition);
}

// security (issue 27, item 1): one owner per address. Another host cannot register at a live
// host's address (it would be called in that host's place); once the owner left or died, a new
// host may take the address (an IP reused after a host was replaced).
TEST_F(WorkerRegistryTest, AnAddressHasOneLiveOwner) {
  WorkerRegistry* registry = registry_.get();
  WorkerInfo owner{.host = "host-0", .address = "10.0.0.5:7071", .incarnation = "a1"};
  ASSERT_TRUE(registry->Register(owner).ok());
  WorkerInfo intruder{.host = "host-1", .address = "10.0.0.5:7071", .incarnation = "b1"};
  const absl::Status refused = registry->Register(intruder);
  EXPECT_EQ(refused.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(refused.message().find("belongs to host host-0"), absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("host host-1 cannot register"), absl::string_view::npos);
  EXPECT_EQ(registry->List().size(), 1u);  // nothing of the refused one is kept
  EXPECT_TRUE(registry->Heartbeat("host-0", "a1").ok());

  // The owner restarts at another address (after going quiet): the old one is free.
  clock_.Advance(absl::Seconds(8));
  owner.incarnation = "a2";
  owner.address = "10.0.0.6:7071";
  ASSERT_TRUE(registry->Register(owner).ok());
  intruder.incarnation = "b2";
  ASSERT_TRUE(registry->Register(intruder).ok()) << "10.0.0.5 is no longer host-0's";

  // A host that left owns nothing; one that died keeps its address until another takes it.
  ASSERT_TRUE(registry->Deregister("host-1", "b2").ok());
  WorkerInfo next{.host = "host-2", .address = "10.0.0.5:7071", .incarnation = "c1"};
  EXPECT_TRUE(registry->Register(next).ok());
  clock_.Advance(absl::Seconds(11));  // host-0 and host-2 declared DEAD
  WorkerInfo replacement{.host = "host-3", .address = "10.0.0.6:7071", .incarnation = "d1"};
  EXPECT_TRUE(registry->Register(replacement).ok());
}

}  // namespace
}  // namespace meshrun::coordinator
