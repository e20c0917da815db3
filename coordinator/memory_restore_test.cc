#include "coordinator/memory_restore.h"

#include <gtest/gtest.h>

namespace meshrun::coordinator {
namespace {

// `of_host`: the ring peer whose copy it is; empty: the holder's own blocks.
v1::MemoryCheckpointHeld Held(const std::string& job, int64_t step,
                              const std::string& of_host = "") {
  v1::MemoryCheckpointHeld held;
  held.set_job_id(job);
  held.set_step(step);
  held.set_data_position(step * 4);
  held.set_of_host(of_host);
  return held;
}

SurvivingHost Survivor(const std::string& host, std::vector<v1::MemoryCheckpointHeld> held) {
  return {.host = host, .address = host + ":7071", .held = std::move(held)};
}

std::vector<std::string> Hosts(const v1::MemoryRestore& restore) {
  std::vector<std::string> hosts;
  for (const auto& holder : restore.holders()) hosts.push_back(holder.host());
  return hosts;
}

TEST(PickMemoryRestore, AReplicaLostIsCoveredByAnySurvivorsCopy) {
  // host-b died: host-a and host-c hold 70 (host-c also 60); the newest step wins.
  const auto restore = PickMemoryRestore(
      "j", {"host-a", "host-b", "host-c"},
      {Survivor("host-a", {Held("j", 70), Held("j", 60)}), Survivor("host-c", {Held("j", 70)})},
      /*replicas=*/true, /*at_least=*/60);
  ASSERT_TRUE(restore.has_value());
  EXPECT_EQ(restore->step(), 70);
  EXPECT_EQ(restore->data_position(), 280);
  EXPECT_EQ(Hosts(*restore), (std::vector<std::string>{"host-a", "host-c"}));
  EXPECT_EQ(restore->holders(0).address(), "host-a:7071");
}

TEST(PickMemoryRestore, HostsOneSnapshotApartAgreeOnTheOlderStep) {
  // One SPMD program over two hosts, both alive: host-b took 80 before the run ended, host-a
  // did not; both hold 70.
  const auto restore = PickMemoryRestore(
      "j", {"host-a", "host-b"},
      {Survivor("host-a", {Held("j", 70), Held("j", 60)}),
       Survivor("host-b", {Held("j", 80), Held("j", 70)})},
      /*replicas=*/false, 0);
  ASSERT_TRUE(restore.has_value());
  EXPECT_EQ(restore->step(), 70);
  EXPECT_EQ(Hosts(*restore), (std::vector<std::string>{"host-a", "host-b"}));
}

TEST(PickMemoryRestore, AnSpmdHostLostLeavesItsShardsUncovered) {
  EXPECT_FALSE(PickMemoryRestore("j", {"host-a", "host-b"},
                                 {Survivor("host-a", {Held("j", 70)})}, /*replicas=*/false, 0)
                   .has_value());
}

TEST(PickMemoryRestore, AnSpmdHostLostIsCoveredByItsRingSuccessorsCopy) {
  // A ring over host-a, host-b, host-c: each keeps its predecessor's blocks. host-b died;
  // host-c holds its copy of 70 (not yet of 80, which host-a took alone).
  const auto restore = PickMemoryRestore(
      "j", {"host-a", "host-b", "host-c"},
      {Survivor("host-a", {Held("j", 80), Held("j", 70), Held("j", 70, "host-c")}),
       Survivor("host-c", {Held("j", 70), Held("j", 70, "host-b")})},
      /*replicas=*/false, 0);
  ASSERT_TRUE(restore.has_value());
  EXPECT_EQ(restore->step(), 70);
  ASSERT_EQ(Hosts(*restore), (std::vector<std::string>{"host-a", "host-c"}));
  EXPECT_EQ(std::vector<std::string>(restore->holders(1).blocks_of().begin(),
                                     restore->holders(1).blocks_of().end()),
            (std::vector<std::string>{"host-c", "host-b"}));
}

TEST(PickMemoryRestore, TwoNeighboursLostLeaveTheDiskTier) {
  // host-a and host-b died: host-c holds host-b's copy, but host-a's only copy was on host-b.
  EXPECT_FALSE(PickMemoryRestore("j", {"host-a", "host-b", "host-c"},
                                 {Survivor("host-c", {Held("j", 70), Held("j", 70, "host-b")})},
                                 /*replicas=*/false, 0)
                   .has_value());
}

TEST(PickMemoryRestore, AStepPastTheSummarizedOnesWaitsForAnOlderOne) {
  // host-a kept its state at step 74 when host-b died, but no summary of step 74 was
  // combined: restoring 74 would leave a hole in the series, so 70 it is.
  const auto restore = PickMemoryRestore(
      "j", {"host-a", "host-b"}, {Survivor("host-a", {Held("j", 74), Held("j", 70)})},
      /*replicas=*/true, /*at_least=*/50, /*at_most=*/73);
  ASSERT_TRUE(restore.has_value());
  EXPECT_EQ(restore->step(), 70);
}

TEST(PickMemoryRestore, OlderThanTheDiskCheckpointOrAnotherJobsDoesNotCount) {
  EXPECT_FALSE(PickMemoryRestore("j", {"host-a", "host-b"},
                                 {Survivor("host-a", {Held("j", 50), Held("other", 90)})},
                                 /*replicas=*/true, /*at_least=*/60)
                   .has_value());
  EXPECT_FALSE(PickMemoryRestore("j", {"host-a", "host-b"}, {}, true, 0).has_value());
}

}  // namespace
}  // namespace meshrun::coordinator
