#include "worker/host_identity.h"

#include <gtest/gtest.h>

#include <map>

namespace meshrun::worker {
namespace {

EnvLookup FakeEnv(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(HostIdentityTest, FlagsWhenEnvironmentIsSilent) {
  HostIdentity flags{.host = "h1", .slice_id = 0, .num_slices = 1, .worker_index = 3};
  auto id = ResolveHostIdentity(flags, FakeEnv({}));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->host, "h1");
  EXPECT_EQ(id->worker_index, 3);
}

TEST(HostIdentityTest, TpuEnvironmentWinsAndNamesTheHost) {
  auto id = ResolveHostIdentity({}, FakeEnv({{"TPU_WORKER_ID", "2"},
                                             {"TPU_WORKER_HOSTNAMES", "t-0, t-1,t-2,t-3"},
                                             {"MEGASCALE_SLICE_ID", "1"},
                                             {"MEGASCALE_NUM_SLICES", "2"}}));
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(id->host, "t-2");
  EXPECT_EQ(id->worker_index, 2);
  EXPECT_EQ(id->slice_id, 1);
  EXPECT_EQ(id->num_slices, 2);
  EXPECT_EQ(id->slice_hostnames.size(), 4u);
}

TEST(HostIdentityTest, MalformedValuesNameTheVariable) {
  auto bad_int = ResolveHostIdentity({}, FakeEnv({{"TPU_WORKER_ID", "two"}}));
  EXPECT_EQ(bad_int.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad_int.status().message().find("TPU_WORKER_ID"), absl::string_view::npos);

  auto outside = ResolveHostIdentity(
      {}, FakeEnv({{"TPU_WORKER_ID", "4"}, {"TPU_WORKER_HOSTNAMES", "a,b"}}));
  EXPECT_NE(outside.status().message().find("TPU_WORKER_HOSTNAMES"), absl::string_view::npos);

  auto slice = ResolveHostIdentity(
      {}, FakeEnv({{"MEGASCALE_SLICE_ID", "2"}, {"MEGASCALE_NUM_SLICES", "2"}}));
  EXPECT_NE(slice.status().message().find("MEGASCALE_SLICE_ID"), absl::string_view::npos);
}

TEST(HostIdentityTest, DefaultsToMachineHostName) {
  auto id = ResolveHostIdentity({}, FakeEnv({}));
  ASSERT_TRUE(id.ok());
  EXPECT_FALSE(id->host.empty());
}

}  // namespace
}  // namespace meshrun::worker
