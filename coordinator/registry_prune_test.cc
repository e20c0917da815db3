// limits (issue 16): DEAD and LEFT workers, and replaced incarnations, are forgotten after a TTL.
#include <gtest/gtest.h>

#include "common/clock.h"
#include "coordinator/worker_registry.h"

namespace meshrun::coordinator {
namespace {

WorkerInfo Worker(const std::string& host, const std::string& incarnation) {
  return WorkerInfo{.host = host, .address = host + ":7071", .incarnation = incarnation};
}

TEST(RegistryPruneTest, ForgetsDeadAndLeftHostsAfterTheTtl) {
  FakeClock clock;
  auto registry = WorkerRegistry::Create({.heartbeat_timeout = absl::Seconds(10),
                                          .forget_after = absl::Minutes(5),
                                          .clock = &clock})
                      .value();
  ASSERT_TRUE(registry->Register(Worker("dead", "d1")).ok());
  ASSERT_TRUE(registry->Register(Worker("left", "l1")).ok());
  ASSERT_TRUE(registry->Register(Worker("alive", "a1")).ok());
  ASSERT_TRUE(registry->Deregister("left", "l1").ok());
  for (int i = 0; i < 12; ++i) {  // one minute, "alive" heartbeating
    clock.Advance(absl::Seconds(5));
    ASSERT_TRUE(registry->Heartbeat("alive", "a1").ok());
  }
  EXPECT_EQ(registry->List().size(), 3u) << "DEAD and LEFT are listed until the TTL";
  EXPECT_EQ(registry->ExpireOverdue().size(), 1u);
  for (int i = 0; i < 60; ++i) {  // five more minutes
    clock.Advance(absl::Seconds(5));
    ASSERT_TRUE(registry->Heartbeat("alive", "a1").ok());
  }
  const std::vector<WorkerEntry> listed = registry->List();
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].info.host, "alive");
  // A forgotten host is unknown: it registers again as a new member.
  EXPECT_EQ(registry->Heartbeat("dead", "d1").code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(registry->Register(Worker("dead", "d2")).ok());
}

TEST(RegistryPruneTest, ForgetsReplacedIncarnationsAfterTheTtl) {
  FakeClock clock;
  auto registry = WorkerRegistry::Create({.heartbeat_timeout = absl::Seconds(10),
                                          .forget_after = absl::Minutes(5),
                                          .clock = &clock})
                      .value();
  ASSERT_TRUE(registry->Register(Worker("h", "i1")).ok());
  ASSERT_TRUE(registry->Register(Worker("h", "i2")).ok());
  // Within the TTL the replaced incarnation cannot come back.
  EXPECT_EQ(registry->Register(Worker("h", "i1")).code(), absl::StatusCode::kAlreadyExists);
  for (int i = 0; i < 61; ++i) {
    clock.Advance(absl::Seconds(5));
    ASSERT_TRUE(registry->Heartbeat("h", "i2").ok());
  }
  registry->List();
  EXPECT_TRUE(registry->Register(Worker("h", "i1")).ok());
}

}  // namespace
}  // namespace meshrun::coordinator
