// Multislice planning (coordinator/multislice.h, mesh_planner.h) on registered fake TPU hosts
// of 2 slices x v6e-8 and 2 x v6e-16, the refusals of inconsistent slices, CPU replicas spread
// over slices, and the MEGASCALE_* settings a worker hands libtpu (runtime/megascale.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "absl/strings/str_cat.h"
#include "coordinator/mesh_planner.h"
#include "coordinator/multislice.h"
#include "runtime/megascale.h"

namespace meshrun::coordinator {
namespace {

using runtime::DeviceDescription;
// Passes when `part` occurs in `text`, else shows both.
::testing::AssertionResult Has(const std::string& text, const std::string& part) {
  if (text.find(part) != std::string::npos) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "\"" << part << "\" not in \"" << text << "\"";
}

const runtime::RuntimeIdentity kTpu{.platform_name = "tpu", .platform_version = "0.0.37",
                                    .pjrt_api_major = 0, .pjrt_api_minor = 67,
                                    .plugin_sha256 = std::string(64, 'e')};

// Host `index` of slice `slice` (of `slices`): a 2 x rows block of chips at row 2*index... of
// a 2-wide (v6e-8: 2x4, v6e-16 host blocks of 2x2 in a 4x4) slice. Global ids are unique over
// slices: slice * chips_per_slice + x + width * y.
WorkerInfo Host(int slice, int slices, int index, int x0, int y0, int width, int per_slice) {
  WorkerInfo info{.host = absl::StrCat("s", slice, "-w", index),
                  .address = absl::StrCat("10.0.", slice, ".", index + 10, ":7071"),
                  .incarnation = "i",
                  .slice_id = slice,
                  .num_slices = slices,
                  .worker_index = index,
                  .runtime = kTpu};
  for (int y = y0; y < y0 + 2; ++y) {
    for (int x = x0; x < x0 + 2; ++x) {
      const int local = static_cast<int>(info.devices.size());
      info.devices.push_back(DeviceDescription{
          .global_id = slice * per_slice + x + width * y,
          .local_id = local,
          .process_index = slice * 100 + index,
          .kind = "TPU v6 lite",
          .runtime_name = absl::StrCat("TPU:", local),
          .coords = {x, y, 0}});
    }
  }
  return info;
}

// v6e-8 (2x4): 2 hosts of 2x2; v6e-16 (4x4): 4 hosts of 2x2.
std::vector<WorkerInfo> V6e8Slices(int slices) {
  std::vector<WorkerInfo> hosts;
  for (int s = 0; s < slices; ++s) {
    for (int w = 0; w < 2; ++w) hosts.push_back(Host(s, slices, w, 0, 2 * w, 2, 8));
  }
  return hosts;
}
std::vector<WorkerInfo> V6e16Slices(int slices) {
  std::vector<WorkerInfo> hosts;
  for (int s = 0; s < slices; ++s) {
    for (int w = 0; w < 4; ++w) hosts.push_back(Host(s, slices, w, 2 * (w % 2), 2 * (w / 2), 4, 16));
  }
  return hosts;
}

std::vector<WorkerInfo> Shuffled(std::vector<WorkerInfo> hosts) {
  std::mt19937 rng(3);
  std::shuffle(hosts.begin(), hosts.end(), rng);
  return hosts;
}

TEST(MultisliceTest, TwoV6e8SlicesPutDataAcrossSlicesOutermost) {
  absl::StatusOr<MeshPlan> plan = PlanMesh({}, Shuffled(V6e8Slices(2)));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->axis_names, std::vector<std::string>{"data"});
  EXPECT_EQ(plan->shape, std::vector<int64_t>{16});
  EXPECT_EQ(plan->num_slices, 2);
  EXPECT_EQ(plan->dcn_shape, std::vector<int64_t>{2});
  EXPECT_EQ(plan->ici_shape, std::vector<int64_t>{8});
  EXPECT_EQ(plan->hosts, (std::vector<std::string>{"s0-w0", "s0-w1", "s1-w0", "s1-w1"}));
  // data index d is in slice d / 8: the first 8 devices are slice 0's, the next 8 slice 1's.
  for (size_t d = 0; d < 16; ++d) {
    EXPECT_EQ(plan->device_ids[d] / 8, static_cast<int>(d / 8)) << d;
    EXPECT_EQ(plan->device_hosts[d].substr(0, 2), d < 8 ? "s0" : "s1") << d;
  }
  EXPECT_EQ(plan->host_slices.at("s1-w1"), 1);
  EXPECT_EQ(plan->ToString(), "data=16 (dcn 2 x ici 8) on 4 hosts in 2 slices (" +
                                  runtime::ToString(kTpu) + ")");
  // libtpu's settings: slice 0's worker 0 coordinates, every host its own slice id.
  ASSERT_EQ(plan->megascale.size(), 4u);
  for (const auto& [host, config] : plan->megascale) {
    EXPECT_EQ(config.coordinator_address, "10.0.0.10") << host;
    EXPECT_EQ(config.port, runtime::kDefaultMegascalePort);
    EXPECT_EQ(config.num_slices, 2);
    EXPECT_EQ(config.slice_id, host[1] - '0') << host;
  }
  // The same hosts in another order give the same plan.
  absl::StatusOr<MeshPlan> again = PlanMesh({}, V6e8Slices(2));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->device_ids, plan->device_ids);
}

TEST(MultisliceTest, ModelGroupsStayInsideAHostOfASlice) {
  absl::StatusOr<MeshPlan> plan = PlanMesh({.tp = 4}, V6e8Slices(2));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->axis_names, (std::vector<std::string>{"data", "model"}));
  EXPECT_EQ(plan->shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(plan->dcn_shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(plan->ici_shape, (std::vector<int64_t>{2, 4}));
  for (size_t g = 0; g < 4; ++g) {
    for (size_t i = 1; i < 4; ++i) {
      EXPECT_EQ(plan->device_hosts[g * 4 + i], plan->device_hosts[g * 4]) << g;
    }
  }
  // Experts may span the hosts of a slice, never slices: ep=8 fills one slice exactly.
  absl::StatusOr<MeshPlan> experts = PlanMesh({.ep = 8}, V6e8Slices(2));
  ASSERT_TRUE(experts.ok()) << experts.status();
  EXPECT_EQ(experts->shape, (std::vector<int64_t>{2, 8}));
  EXPECT_EQ(experts->dcn_shape, (std::vector<int64_t>{2, 1}));
}

TEST(MultisliceTest, TwoV6e16Slices) {
  absl::StatusOr<MeshPlan> plan = PlanMesh({.tp = 4}, Shuffled(V6e16Slices(2)));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->shape, (std::vector<int64_t>{8, 4}));
  EXPECT_EQ(plan->dcn_shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(plan->ici_shape, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(plan->hosts.size(), 8u);
  EXPECT_EQ(plan->hosts[4], "s1-w0");
  for (size_t d = 0; d < 32; ++d) EXPECT_EQ(plan->device_ids[d] / 16, static_cast<int>(d / 16));
  EXPECT_EQ(plan->megascale.at("s1-w3").coordinator_address, "10.0.0.10");
  EXPECT_EQ(plan->megascale.at("s1-w3").slice_id, 1);
  absl::StatusOr<MeshPlan> dp = PlanMesh({}, V6e16Slices(2));
  ASSERT_TRUE(dp.ok()) << dp.status();
  EXPECT_EQ(dp->ToString().substr(0, 24), "data=32 (dcn 2 x ici 16)");
}

TEST(MultisliceTest, RefusalsSayWhatFitsOverSlices) {
  absl::StatusOr<MeshPlan> odd = PlanMesh({.dp = 2, .tp = 8}, V6e8Slices(2));
  ASSERT_FALSE(odd.ok());
  EXPECT_TRUE(Has(std::string(odd.status().message()), "tp=8 exceeds the 4 chips"));
  EXPECT_TRUE(Has(std::string(odd.status().message()),
              "fits: dp=16 (dcn 2 x ici 8), dp=8 (dcn 2 x ici 4) tp=2, "
                        "dp=4 (dcn 2 x ici 2) tp=4"));
  EXPECT_TRUE(Has(std::string(odd.status().message()), "ep*tp dividing the 8 devices of a slice"));
  // ep=16 would put an expert group across both slices.
  absl::StatusOr<MeshPlan> wide = PlanMesh({.ep = 16}, V6e8Slices(2));
  ASSERT_FALSE(wide.ok());
  EXPECT_EQ(wide.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(Has(std::string(wide.status().message()),
              "ep*tp=16 devices would span slices; it must lie within one slice of 8"));
  // Three slices: dp=8 x ep=3 uses all 24 devices, but a group of 3 cannot tile a slice of 8
  // (and so data would not split evenly over the slices either).
  absl::StatusOr<MeshPlan> split = PlanMesh({.dp = 8, .ep = 3}, V6e8Slices(3));
  ASSERT_FALSE(split.ok());
  EXPECT_TRUE(Has(std::string(split.status().message()),
                  "ep*tp=3 devices would span slices; it must lie within one slice of 8 devices; "
                  "fits: dp=24 (dcn 3 x ici 8), dp=12 (dcn 3 x ici 4) tp=2"));
}

TEST(MultisliceTest, InconsistentSlicesAreRefusedByName) {
  auto refusal = [](std::vector<WorkerInfo> hosts) {
    absl::StatusOr<MeshPlan> plan = PlanMesh({}, std::move(hosts));
    EXPECT_FALSE(plan.ok());
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
    return std::string(plan.status().message());
  };
  std::vector<WorkerInfo> hosts = V6e8Slices(2);
  hosts.pop_back();  // slice 1 lost a host
  EXPECT_TRUE(Has(refusal(hosts), "slices differ in size: 1 host in slice 1; 2 hosts in slice 0 "
                        "(slice 0: s0-w0, s0-w1; slice 1: s1-w0)"));
  hosts = V6e8Slices(2);
  hosts.erase(hosts.begin() + 2, hosts.end());  // only slice 0 is up
  EXPECT_TRUE(Has(refusal(hosts), "the hosts declare 2 slices but slice 1 has no live host "
                                        "(slice 0: s0-w0, s0-w1); start the missing slice's "
                                        "hosts, or restart these with --num_slices=1"));
  hosts = V6e8Slices(2);
  hosts[3].num_slices = 3;
  EXPECT_TRUE(Has(refusal(hosts), "hosts disagree on the number of slices: "
                                        "2 on s0-w0, s0-w1, s1-w0; 3 on s1-w1"));
  hosts = V6e8Slices(2);
  hosts[3].slice_id = 2;
  EXPECT_TRUE(Has(refusal(hosts), "host s1-w1 is in slice 2 but there are 2 slices"));
  hosts = V6e8Slices(2);
  hosts[3].worker_index = 0;
  EXPECT_TRUE(Has(refusal(hosts), "hosts s1-w0 and s1-w1 both claim worker index 0 of slice 1"));
}

WorkerInfo CpuHost(const std::string& name, int slice, int slices, int index) {
  WorkerInfo info{.host = name, .address = name + ":1", .slice_id = slice,
                  .num_slices = slices, .worker_index = index,
                  .runtime = {.platform_name = "cpu", .platform_version = "0.81"}};
  for (int i = 0; i < 4; ++i) {
    info.devices.push_back(DeviceDescription{.global_id = i, .local_id = i, .kind = "cpu"});
  }
  return info;
}

TEST(MultisliceTest, CpuReplicasSpreadEvenlyOverSlices) {
  // Slice 0 has two hosts, slice 1 one: two replicas take one of each.
  std::vector<WorkerInfo> hosts = {CpuHost("a", 0, 2, 0), CpuHost("b", 0, 2, 1),
                                   CpuHost("c", 1, 2, 0)};
  absl::StatusOr<MeshPlan> plan = PlanCpuJob({.dp = 4}, 2, hosts, {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->replica_hosts, (std::vector<std::string>{"a", "c"}));
  EXPECT_EQ(plan->num_slices, 2);
  EXPECT_EQ(plan->host_slices, (std::map<std::string, int>{{"a", 0}, {"c", 1}}));
  EXPECT_EQ(plan->megascale.at("c").coordinator_address, "a");
  EXPECT_EQ(plan->megascale.at("c").slice_id, 1);
  EXPECT_TRUE(Has(plan->ToString(), "on each of 2 hosts in 2 slices (data-parallel"));
  // Slice 1's only host is busy: retry later, naming it.
  absl::StatusOr<MeshPlan> busy = PlanCpuJob({.dp = 4}, 2, hosts, {"c"});
  ASSERT_FALSE(busy.ok());
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kUnavailable) << busy.status();
  EXPECT_TRUE(Has(std::string(busy.status().message()), "1 in each of 2 slices"));
  absl::StatusOr<MeshPlan> three = PlanCpuJob({.dp = 4}, 3, hosts, {});
  ASSERT_FALSE(three.ok());
  EXPECT_TRUE(Has(std::string(three.status().message()),
              "mesh.host_replicas is 3 but the hosts form 2 slices"));
}

TEST(MultisliceTest, HostsSortNumerically) {
  std::vector<WorkerInfo> hosts;
  for (const char* name : {"worker-10", "worker-2", "worker-1"}) {
    hosts.push_back(CpuHost(name, 0, 1, 0));
  }
  PinResult pinned = PinRuntime(hosts, {});
  ASSERT_EQ(pinned.eligible.size(), 3u);
  EXPECT_EQ(pinned.eligible[1].host, "worker-2");
  EXPECT_EQ(pinned.eligible[2].host, "worker-10");
}

using Env = std::map<std::string, std::string>;
runtime::EnvironmentLookup Lookup(Env env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

TEST(MegascaleTest, SingleSliceSetsNothing) {
  auto config = runtime::ResolveMegascale({.host = "h", .num_slices = 1}, Lookup({}));
  ASSERT_TRUE(config.ok());
  EXPECT_FALSE(config->has_value());
}

TEST(MegascaleTest, EnvironmentWinsThenFlagsThenSliceZerosFirstHost) {
  runtime::MegascaleInputs inputs{.host = "t1-w1", .slice_id = 1, .num_slices = 2,
                                  .worker_index = 1, .flag_coordinator = "flag-host"};
  auto from_flag = runtime::ResolveMegascale(inputs, Lookup({}));
  ASSERT_TRUE(from_flag.ok() && from_flag->has_value()) << from_flag.status();
  EXPECT_EQ((*from_flag)->coordinator_address, "flag-host");
  EXPECT_EQ((*from_flag)->port, 8080);
  auto from_env = runtime::ResolveMegascale(
      inputs, Lookup({{"MEGASCALE_COORDINATOR_ADDRESS", "js-slice-0-0.js:9000"}}));
  ASSERT_TRUE(from_env.ok() && from_env->has_value()) << from_env.status();
  EXPECT_EQ((*from_env)->coordinator_address, "js-slice-0-0.js");
  EXPECT_EQ((*from_env)->port, 9000);
  auto port = runtime::ResolveMegascale(
      inputs, Lookup({{"MEGASCALE_COORDINATOR_ADDRESS", "[fd00::1]:9000"},
                      {"MEGASCALE_PORT", "8081"}}));
  ASSERT_TRUE(port.ok() && port->has_value()) << port.status();
  EXPECT_EQ((*port)->coordinator_address, "fd00::1");
  EXPECT_EQ((*port)->port, 8081);
  EXPECT_EQ(runtime::MegascaleEnvironment(**port),
            (std::vector<std::pair<std::string, std::string>>{
                {"MEGASCALE_COORDINATOR_ADDRESS", "fd00::1"},
                {"MEGASCALE_NUM_SLICES", "2"},
                {"MEGASCALE_PORT", "8081"},
                {"MEGASCALE_SLICE_ID", "1"}}));
  // Slice 0 knows its own first host: TPU_WORKER_HOSTNAMES[0], or itself as worker 0.
  auto slice0 = runtime::ResolveMegascale(
      {.host = "t0-w1", .num_slices = 2, .worker_index = 1, .slice_hostnames = {"t0-w0", "t0-w1"}},
      Lookup({}));
  ASSERT_TRUE(slice0.ok() && slice0->has_value());
  EXPECT_EQ((*slice0)->coordinator_address, "t0-w0");
  auto self = runtime::ResolveMegascale({.host = "t0-w0", .num_slices = 2}, Lookup({}));
  ASSERT_TRUE(self.ok() && self->has_value());
  EXPECT_EQ((*self)->coordinator_address, "t0-w0");
}

TEST(MegascaleTest, ErrorsNameTheFix) {
  auto unknown = runtime::ResolveMegascale({.host = "t1-w0", .slice_id = 1, .num_slices = 2},
                                           Lookup({}));
  ASSERT_FALSE(unknown.ok());
  EXPECT_TRUE(Has(std::string(unknown.status().message()),
              "host t1-w0 is in slice 1 of 2 but the megascale coordinator is "
                        "unknown: set MEGASCALE_COORDINATOR_ADDRESS or --megascale_coordinator"));
  auto bad_port = runtime::ResolveMegascale({.host = "t0-w0", .num_slices = 2},
                                            Lookup({{"MEGASCALE_PORT", "80808"}}));
  ASSERT_FALSE(bad_port.ok());
  EXPECT_TRUE(Has(std::string(bad_port.status().message()),
              "MEGASCALE_PORT is \"80808\"; use a port number 1..65535"));
  auto bad_flag = runtime::ResolveMegascale({.host = "t0-w0", .num_slices = 2, .flag_port = 0},
                                            Lookup({}));
  ASSERT_FALSE(bad_flag.ok());
  EXPECT_TRUE(Has(std::string(bad_flag.status().message()), "--megascale_port is 0"));
  auto bracket = runtime::ResolveMegascale(
      {.host = "t0-w0", .num_slices = 2}, Lookup({{"MEGASCALE_COORDINATOR_ADDRESS", "[fd00::1"}}));
  ASSERT_FALSE(bracket.ok());
  EXPECT_TRUE(Has(std::string(bracket.status().message()), "has no closing ']'"));
}

}  // namespace
}  // namespace meshrun::coordinator
