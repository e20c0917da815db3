#include "jobspec/memory_tier.h"

#include <gtest/gtest.h>

namespace meshrun::jobspec {
namespace {

// A mode-A job whose step program takes w f32[8,4] split over "data" and b f32[4] replicated.
v1::JobSpec SpecWithState() {
  v1::JobSpec spec;
  spec.set_state_count(2);
  spec.mutable_checkpoint()->set_directory("/tmp/ckpt");
  spec.mutable_checkpoint()->set_every_steps(100);
  v1::Program* step = spec.add_programs();
  step->set_role("step");
  v1::TensorSpec* w = step->add_inputs();
  w->set_name("w");
  w->set_dtype("f32");
  w->add_shape(8);
  w->add_shape(4);
  w->add_sharding("data");
  w->add_sharding("");
  v1::TensorSpec* b = step->add_inputs();
  b->set_name("b");
  b->set_dtype("f32");
  b->add_shape(4);
  b->add_sharding("");
  return spec;
}

// One SPMD program over `hosts` hosts with two devices each, data = 2 * hosts.
v1::MeshAssignment Spanning(int hosts) {
  v1::MeshAssignment mesh;
  mesh.add_axis_names("data");
  mesh.add_shape(2 * hosts);
  for (int d = 0; d < 2 * hosts; ++d) {
    mesh.add_device_ids(d);
    mesh.add_device_hosts("host-" + std::to_string(d / 2));
  }
  return mesh;
}

TEST(MemoryTier, ARingOverTheHostsOfOneProgram) {
  const v1::MeshAssignment mesh = Spanning(3);
  EXPECT_EQ(RingHosts(mesh), (std::vector<std::string>{"host-0", "host-1", "host-2"}));
  EXPECT_EQ(RingPredecessor(mesh, "host-0"), "host-2");
  EXPECT_EQ(RingPredecessor(mesh, "host-2"), "host-1");
  EXPECT_EQ(PartitionsOf(mesh, "host-1"), (std::vector<int64_t>{2, 3}));
  v1::MeshAssignment replicas = Spanning(1);  // host replicas: device_hosts empty
  replicas.clear_device_hosts();
  replicas.add_replica_hosts("host-a");
  replicas.add_replica_hosts("host-b");
  EXPECT_TRUE(RingHosts(replicas).empty());
  EXPECT_EQ(RingPredecessor(replicas, "host-a"), "");
  EXPECT_EQ(PartitionsOf(replicas, "host-a"), (std::vector<int64_t>{0, 1}));
}

TEST(MemoryTier, HostBytesCountItsBlocksAndItsPeersTwice) {
  const v1::JobSpec spec = SpecWithState();
  const v1::MeshAssignment mesh = Spanning(2);
  // Each host: 2 distinct w blocks of [2,4] (64 bytes) + b once (16); its peer's the same.
  absl::StatusOr<int64_t> bytes = MemoryTierHostBytes(spec, mesh, "host-0");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, kMemoryCheckpointsKept * 2 * (64 + 16));
  v1::MeshAssignment one_host = Spanning(2);
  one_host.clear_device_hosts();  // a host replica: every block, no peer
  EXPECT_EQ(*MemoryTierHostBytes(spec, one_host, "host-0"), kMemoryCheckpointsKept * (128 + 16));
  v1::JobSpec off = spec;
  off.mutable_checkpoint()->set_memory_every_steps(0);
  EXPECT_EQ(*MemoryTierHostBytes(off, mesh, "host-0"), 0);
}

TEST(MemoryTier, AHostShortOfMemoryIsNamedWithTheFix) {
  const v1::JobSpec spec = SpecWithState();
  const v1::MeshAssignment mesh = Spanning(2);
  EXPECT_TRUE(CheckMemoryTierFits(spec, mesh, "host-1", 320).ok());
  EXPECT_TRUE(CheckMemoryTierFits(spec, mesh, "host-1", 0).ok());  // unknown: not checked
  const absl::Status short_of = CheckMemoryTierFits(spec, mesh, "host-1", 319);
  EXPECT_TRUE(absl::IsResourceExhausted(short_of)) << short_of;
  for (const char* part : {"need 320 bytes of host memory on host-1", "ring peer's",
                           "offers 319", "memory_every_steps to 0"}) {
    EXPECT_NE(short_of.message().find(part), std::string::npos) << part << ": " << short_of;
  }
}

}  // namespace
}  // namespace meshrun::jobspec
