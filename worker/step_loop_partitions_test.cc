// Which mesh partitions a host's devices run, from the whole mesh's device ids or from the
// part of it one host's StartJob carries (RunSpec::device_partitions).
#include <gtest/gtest.h>

#include "worker/step_loop_internal.h"

namespace meshrun::worker {
namespace {

std::vector<runtime::DeviceDescription> Addressable(std::vector<int32_t> global_ids) {
  std::vector<runtime::DeviceDescription> devices;
  for (int32_t id : global_ids) devices.push_back({.global_id = id, .runtime_name = "TPU"});
  return devices;
}

TEST(StepLoopPartitionsTest, TheWholeMeshGivesEachDeviceItsIndex) {
  RunSpec spec{.mesh_axes = {"data"}, .mesh_shape = {4}, .device_ids = {10, 11, 12, 13}};
  auto partitions = PartitionsOf(spec, {0, 1}, Addressable({12, 13}));
  ASSERT_TRUE(partitions.ok()) << partitions.status();
  EXPECT_EQ(*partitions, (std::vector<int64_t>{2, 3}));
}

TEST(StepLoopPartitionsTest, AHostsPartOfTheMeshGivesThePositionsItNames) {
  // A host holding global devices 6 and 7 at mesh positions 6 and 7 of 8, sent with its ring
  // predecessor's (2 and 3) only.
  RunSpec spec{.mesh_axes = {"data"},
               .mesh_shape = {8},
               .device_ids = {2, 3, 6, 7},
               .device_partitions = {2, 3, 6, 7}};
  auto partitions = PartitionsOf(spec, {1, 0}, Addressable({6, 7}));
  ASSERT_TRUE(partitions.ok()) << partitions.status();
  EXPECT_EQ(*partitions, (std::vector<int64_t>{7, 6}));
}

TEST(StepLoopPartitionsTest, APartOfTheMeshThatDoesNotAddUpIsRefused) {
  RunSpec spec{.mesh_axes = {"data"}, .mesh_shape = {8}, .device_ids = {6, 7},
               .device_partitions = {6}};
  EXPECT_TRUE(absl::IsInvalidArgument(PartitionsOf(spec, {0}, Addressable({6})).status()));
  spec.device_partitions = {6, 9};  // past the mesh's 8 partitions
  auto beyond = PartitionsOf(spec, {0, 1}, Addressable({6, 7}));
  ASSERT_TRUE(absl::IsInvalidArgument(beyond.status()));
  EXPECT_NE(beyond.status().message().find("partition 9 of a mesh of 8"), std::string::npos)
      << beyond.status();
  // A device the mesh does not name, whole or in part.
  spec.device_partitions = {6, 7};
  EXPECT_TRUE(absl::IsInvalidArgument(PartitionsOf(spec, {0}, Addressable({5})).status()));
}

}  // namespace
}  // namespace meshrun::worker
