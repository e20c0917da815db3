#include "coordinator/mesh_planner.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <map>

#include "absl/strings/str_cat.h"

namespace meshrun::coordinator {
namespace {

using runtime::DeviceDescription;
using runtime::RuntimeIdentity;

RuntimeIdentity Tpu(const std::string& version = "0.0.37") {
  return {.platform_name = "tpu", .platform_version = version, .pjrt_api_major = 0,
          .pjrt_api_minor = 67, .plugin_sha256 = "9f8e7d6c" + std::string(56, version.back())};
}
RuntimeIdentity Cpu() {
  return {.platform_name = "cpu", .platform_version = "0.81", .pjrt_api_major = 0,
          .pjrt_api_minor = 67, .plugin_sha256 = "1a2b3c4d" + std::string(56, '0')};
}

// A TPU host whose chips have global ids x + global_width * y and coords (x, y, 0).
WorkerInfo TpuHost(const std::string& name, int index, std::vector<std::pair<int, int>> xy,
                   int global_width, const RuntimeIdentity& identity = Tpu()) {
  WorkerInfo info{.host = name, .worker_index = index, .runtime = identity};
  for (size_t i = 0; i < xy.size(); ++i) {
    const auto [x, y] = xy[i];
    info.devices.push_back(DeviceDescription{.global_id = x + global_width * y,
                                             .local_id = static_cast<int32_t>(i),
                                             .process_index = index,
                                             .kind = "TPU v6 lite",
                                             .runtime_name = absl::StrCat("TPU:", i),
                                             .coords = {x, y, 0}});
  }
  return info;
}

// The chips of the 2x2 (or 2xheight) block at (x0, y0).
std::vector<std::pair<int, int>> Block(int x0, int y0, int height) {
  std::vector<std::pair<int, int>> xy;
  for (int y = y0; y < y0 + height; ++y) {
    for (int x = x0; x < x0 + 2; ++x) xy.push_back({x, y});
  }
  return xy;
}

// A CPU host with `n` devices and no coords, listed in reverse so order must come from ids.
WorkerInfo CpuHost(const std::string& name, int index, int n, int first_global,
                   const RuntimeIdentity& identity = Cpu()) {
  WorkerInfo info{.host = name, .worker_index = index, .runtime = identity};
  for (int i = n - 1; i >= 0; --i) {
    info.devices.push_back(DeviceDescription{.global_id = first_global + i,
                                             .local_id = i,
                                             .process_index = index,
                                             .kind = "cpu",
                                             .runtime_name = absl::StrCat("cpu:", i)});
  }
  return info;
}

std::vector<WorkerInfo> V6e8OneHost() { return {TpuHost("tpu-0", 0, Block(0, 0, 4), 2)}; }
std::vector<WorkerInfo> V6e8TwoHosts() {  // listed out of order on purpose
  return {TpuHost("tpu-1", 1, Block(0, 2, 2), 2), TpuHost("tpu-0", 0, Block(0, 0, 2), 2)};
}
std::vector<WorkerInfo> V6e16FourHosts() {  // a 4x4 slice, each host a 2x2 block
  return {TpuHost("tpu-3", 3, Block(2, 2, 2), 4), TpuHost("tpu-1", 1, Block(2, 0, 2), 4),
          TpuHost("tpu-0", 0, Block(0, 0, 2), 4), TpuHost("tpu-2", 2, Block(0, 2, 2), 4)};
}
std::vector<WorkerInfo> Cpu1x8() { return {CpuHost("cpu-0", 0, 8, 0)}; }
std::vector<WorkerInfo> Cpu2x4() { return {CpuHost("cpu-b", 1, 4, 4), CpuHost("cpu-a", 0, 4, 0)}; }

struct PlanCase {
  std::string name;
  std::vector<WorkerInfo> hosts;
  MeshRequest request;
  std::vector<std::string> axes;
  std::vector<int64_t> shape;
  std::vector<int32_t> device_ids;
  std::vector<std::string> host_order;
};

std::vector<PlanCase> PlanCases() {
  using Axes = std::vector<std::string>;
  const Axes kData = {"data"}, kDataModel = {"data", "model"}, kDataExpert = {"data", "expert"},
             kAll = {"data", "expert", "model"};
  // One v6e-8 host, chips (x, y) with id x + 2y:   0 1 / 2 3 / 4 5 / 6 7 (rows are y).
  return {
      {"v6e8_auto_is_data_parallel_snake", V6e8OneHost(), {}, kData, {8},
       {0, 1, 3, 2, 4, 5, 7, 6}, {"tpu-0"}},
      {"v6e8_tp8_one_ring", V6e8OneHost(), {.tp = 8}, kDataModel, {1, 8},
       {0, 2, 4, 6, 7, 5, 3, 1}, {"tpu-0"}},
      {"v6e8_tp4_two_rings", V6e8OneHost(), {.tp = 4}, kDataModel, {2, 4},
       {0, 2, 3, 1, 4, 6, 7, 5}, {"tpu-0"}},
      {"v6e8_tp2_adjacent_pairs", V6e8OneHost(), {.dp = 4, .tp = 2}, kDataModel, {4, 2},
       {0, 1, 3, 2, 4, 5, 7, 6}, {"tpu-0"}},
      {"v6e8_ep2_tp4", V6e8OneHost(), {.ep = 2, .tp = 4}, kAll, {1, 2, 4},
       {0, 2, 3, 1, 4, 6, 7, 5}, {"tpu-0"}},
      {"v6e8_dp1_leaves_tp8", V6e8OneHost(), {.dp = 1}, kDataModel, {1, 8},
       {0, 2, 4, 6, 7, 5, 3, 1}, {"tpu-0"}},
      {"v6e8_on_two_hosts_tp4", V6e8TwoHosts(), {.tp = 4}, kDataModel, {2, 4},
       {0, 2, 3, 1, 4, 6, 7, 5}, {"tpu-0", "tpu-1"}},
      {"v6e8_on_two_hosts_auto", V6e8TwoHosts(), {}, kData, {8},
       {0, 1, 3, 2, 4, 5, 7, 6}, {"tpu-0", "tpu-1"}},
      // v6e-16 (4x4, id x + 4y), hosts 2x2 blocks: tpu-0 {0,1,4,5} tpu-1 {2,3,6,7} ...
      {"v6e16_four_hosts_tp4", V6e16FourHosts(), {.tp = 4}, kDataModel, {4, 4},
       {0, 4, 5, 1, 2, 6, 7, 3, 8, 12, 13, 9, 10, 14, 15, 11},
       {"tpu-0", "tpu-1", "tpu-2", "tpu-3"}},
      {"v6e16_four_hosts_ep2", V6e16FourHosts(), {.ep = 2}, kDataExpert, {8, 2},
       {0, 1, 5, 4, 2, 3, 7, 6, 8, 9, 13, 12, 10, 11, 15, 14},
       {"tpu-0", "tpu-1", "tpu-2", "tpu-3"}},
      {"v6e16_four_hosts_dp2_ep2_tp4", V6e16FourHosts(), {.dp = 2, .ep = 2, .tp = 4}, kAll,
       {2, 2, 4}, {0, 4, 5, 1, 2, 6, 7, 3, 8, 12, 13, 9, 10, 14, 15, 11},
       {"tpu-0", "tpu-1", "tpu-2", "tpu-3"}},
      {"cpu_one_host_auto", Cpu1x8(), {}, kData, {8}, {0, 1, 2, 3, 4, 5, 6, 7}, {"cpu-0"}},
      {"cpu_one_host_tp2", Cpu1x8(), {.tp = 2}, kDataModel, {4, 2}, {0, 1, 2, 3, 4, 5, 6, 7},
       {"cpu-0"}},
      {"cpu_two_hosts_tp4", Cpu2x4(), {.tp = 4}, kDataModel, {2, 4}, {0, 1, 2, 3, 4, 5, 6, 7},
       {"cpu-a", "cpu-b"}},
      {"cpu_two_hosts_dp2_auto_tp", Cpu2x4(), {.dp = 2}, kDataModel, {2, 4},
       {0, 1, 2, 3, 4, 5, 6, 7}, {"cpu-a", "cpu-b"}},
      {"cpu_two_hosts_all_axes", Cpu2x4(), {.ep = 2, .tp = 2}, kAll, {2, 2, 2},
       {0, 1, 2, 3, 4, 5, 6, 7}, {"cpu-a", "cpu-b"}},
  };
}

class PlanMeshTest : public ::testing::TestWithParam<PlanCase> {};

TEST_P(PlanMeshTest, PlansAxesShapeAndAssignment) {
  const PlanCase& c = GetParam();
  absl::StatusOr<MeshPlan> plan = PlanMesh(c.request, c.hosts);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->axis_names, c.axes);
  EXPECT_EQ(plan->shape, c.shape);
  EXPECT_EQ(plan->device_ids, c.device_ids);
  EXPECT_EQ(plan->hosts, c.host_order);
  EXPECT_EQ(plan->runtime, c.hosts[0].runtime);
  EXPECT_EQ(int64_t{plan->dp} * plan->ep * plan->tp, static_cast<int64_t>(plan->device_ids.size()));

  // Device hosts follow the data-major host order; every model group sits on one host and,
  // where chips have coords, consecutive chips of a group are ICI neighbours.
  std::map<int32_t, std::pair<std::string, std::vector<int32_t>>> chips;
  for (const WorkerInfo& host : c.hosts) {
    for (const DeviceDescription& d : host.devices) chips[d.global_id] = {host.host, d.coords};
  }
  ASSERT_EQ(plan->device_hosts.size(), plan->device_ids.size());
  for (size_t i = 0; i < plan->device_ids.size(); ++i) {
    EXPECT_EQ(plan->device_hosts[i], chips[plan->device_ids[i]].first);
    const size_t host_position = std::find(plan->hosts.begin(), plan->hosts.end(),
                                           plan->device_hosts[i]) - plan->hosts.begin();
    EXPECT_EQ(host_position, i / (plan->device_ids.size() / plan->hosts.size()));
  }
  for (size_t start = 0; start < plan->device_ids.size(); start += plan->tp) {
    for (int k = 1; k < plan->tp; ++k) {
      const auto& a = chips[plan->device_ids[start + k - 1]];
      const auto& b = chips[plan->device_ids[start + k]];
      EXPECT_EQ(a.first, b.first) << "model group across hosts at " << start;
      if (a.second.empty()) continue;
      int distance = 0;
      for (size_t d = 0; d < a.second.size(); ++d) distance += std::abs(a.second[d] - b.second[d]);
      EXPECT_EQ(distance, 1) << "chips " << plan->device_ids[start + k - 1] << " and "
                             << plan->device_ids[start + k] << " are not ICI neighbours";
    }
  }

  // Same plan whatever order the hosts come in.
  std::vector<WorkerInfo> reversed(c.hosts.rbegin(), c.hosts.rend());
  absl::StatusOr<MeshPlan> again = PlanMesh(c.request, reversed);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->device_ids, plan->device_ids);
}

INSTANTIATE_TEST_SUITE_P(Meshes, PlanMeshTest, ::testing::ValuesIn(PlanCases()),
                         [](const auto& info) { return info.param.name; });

struct RefusalCase {
  std::string name;
  std::vector<WorkerInfo> hosts;
  MeshRequest request;
  absl::StatusCode code;
  std::vector<std::string> says;  // substrings of the message
};

std::vector<RefusalCase> RefusalCases() {
  const auto kFailed = absl::StatusCode::kFailedPrecondition;
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  std::vector<WorkerInfo> mixed = V6e8TwoHosts();
  mixed[0].runtime = Tpu("0.0.36");
  std::vector<WorkerInfo> uneven = {CpuHost("cpu-a", 0, 8, 0), CpuHost("cpu-b", 1, 4, 8)};
  std::vector<WorkerInfo> empty_host = Cpu2x4();
  empty_host[0].devices.clear();
  std::vector<WorkerInfo> twice = {CpuHost("cpu-a", 0, 4, 0), CpuHost("cpu-a", 1, 4, 4)};
  std::vector<WorkerInfo> shared_id = {CpuHost("cpu-a", 0, 4, 0), CpuHost("cpu-b", 1, 4, 3)};
  return {
      {"tp_exceeds_host", {CpuHost("cpu-a", 0, 8, 0), CpuHost("cpu-b", 1, 8, 8)}, {.tp = 16},
       kFailed, {"tp=16 exceeds the 8 chips of one host; use tp<=8", "fits: dp=16, dp=8 tp=2"}},
      {"tp_exceeds_single_host", V6e8OneHost(), {.tp = 16}, kFailed,
       {"tp=16 exceeds the 8 chips of one host; use tp<=8"}},
      {"tp_exceeds_split_host", V6e8TwoHosts(), {.tp = 8}, kFailed,
       {"tp=8 exceeds the 4 chips of one host; use tp<=4", "dp=2 tp=4"}},
      {"auto_tp_exceeds_host", V6e16FourHosts(), {.dp = 2}, kFailed,
       {"tp=8 (auto) exceeds the 4 chips of one host"}},
      {"product_does_not_divide", V6e16FourHosts(), {.dp = 3, .tp = 4}, kFailed,
       {"dp*ep*tp=12 does not divide 16 devices; fits: dp=16, dp=8 tp=2, dp=4 tp=4"}},
      {"tp_does_not_divide_host", Cpu1x8(), {.tp = 3}, kFailed,
       {"tp=3 does not divide the 8 chips of one host", "fits: dp=8, dp=4 tp=2, dp=2 tp=4, dp=1 tp=8"}},
      {"dp_does_not_divide", Cpu1x8(), {.dp = 3}, kFailed, {"dp*ep=3 does not divide 8 devices"}},
      {"ep_does_not_divide", Cpu1x8(), {.ep = 3}, kFailed,
       {"ep*tp=3 does not divide 8 devices", "fits: dp=8"}},
      {"ep_kept_in_fits", Cpu1x8(), {.dp = 3, .ep = 2}, kFailed,
       {"dp*ep=6 does not divide 8 devices", "dp=4 ep=2, dp=2 ep=2 tp=2"}},
      {"not_enough_devices", V6e8OneHost(), {.dp = 4, .tp = 4}, kFailed,
       {"not enough devices: dp*ep*tp=16 needs 16 devices but there are 8 devices (1 host of 8)"}},
      {"dp_alone_too_large", Cpu2x4(), {.dp = 1000}, kFailed,
       {"not enough devices: dp=1000", "8 devices (2 hosts of 4)"}},
      {"mesh_smaller_than_hosts", V6e16FourHosts(), {.dp = 1, .tp = 4}, kFailed,
       {"uses only 4 of 16 devices", "give the job 1 of the hosts"}},
      {"different_device_counts", uneven, {}, kFailed,
       {"different device counts: 8 devices on cpu-a; 4 devices on cpu-b"}},
      {"mixed_runtimes", mixed, {}, kFailed,
       {"different runtimes", "tpu 0.0.36", "on tpu-0", "tpu 0.0.37", "on tpu-1"}},
      {"no_hosts", {}, {}, kFailed, {"no eligible hosts"}},
      {"host_without_devices", empty_host, {}, kFailed, {"host cpu-b has no devices"}},
      {"negative_size", Cpu1x8(), {.tp = -1}, kInvalid, {"tp=-1"}},
      {"host_listed_twice", twice, {}, kInvalid, {"host cpu-a is listed twice"}},
      {"device_id_shared", shared_id, {}, kInvalid, {"global device id 3 appears on cpu-a and on cpu-b"}},
  };
}

class RefusalTest : public ::testing::TestWithParam<RefusalCase> {};

TEST_P(RefusalTest, RefusesAndSaysWhatFits) {
  const RefusalCase& c = GetParam();
  absl::StatusOr<MeshPlan> plan = PlanMesh(c.request, c.hosts);
  ASSERT_FALSE(plan.ok()) << plan->ToString();
  EXPECT_EQ(plan.status().code(), c.code) << plan.status();
  for (const std::string& text : c.says) {
    EXPECT_NE(plan.status().message().find(text), absl::string_view::npos)
        << "missing \"" << text << "\" in: " << plan.status().message();
  }
}

INSTANTIATE_TEST_SUITE_P(Refusals, RefusalTest, ::testing::ValuesIn(RefusalCases()),
                         [](const auto& info) { return info.param.name; });

TEST(MeshAxisNamesTest, FollowsTheSeedRule) {
  EXPECT_EQ(MeshAxisNames(1, 1), std::vector<std::string>({"data"}));
  EXPECT_EQ(MeshAxisNames(1, 4), std::vector<std::string>({"data", "model"}));
  EXPECT_EQ(MeshAxisNames(2, 1), std::vector<std::string>({"data", "expert"}));
  EXPECT_EQ(MeshAxisNames(2, 4), std::vector<std::string>({"data", "expert", "model"}));
}

TEST(IciChipOrderTest, FallsBackToLocalIdsWithoutUsableCoords) {
  WorkerInfo host = TpuHost("t", 0, Block(0, 0, 4), 2);
  host.devices[5].coords.clear();  // partial coords
  std::vector<size_t> order = IciChipOrder(host.devices, 8);
  EXPECT_EQ(order, (std::vector<size_t>{0, 1, 2, 3, 4, 5, 6, 7}));
  host = TpuHost("t", 0, {{0, 0}, {1, 0}, {0, 1}, {5, 5}}, 8);  // not a box
  EXPECT_EQ(IciChipOrder(host.devices, 4), (std::vector<size_t>{0, 1, 2, 3}));
}

TEST(IciChipOrderTest, SnakesThroughLargerBoxes) {
  // A 4x4 box in one host: every consecutive pair is one hop apart.
  std::vector<std::pair<int, int>> xy;
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 4; ++x) xy.push_back({x, y});
  }
  WorkerInfo host = TpuHost("t", 0, xy, 4);
  std::vector<size_t> order = IciChipOrder(host.devices, 4);
  ASSERT_EQ(order.size(), 16u);
  for (size_t i = 1; i < order.size(); ++i) {
    const auto& a = host.devices[order[i - 1]].coords;
    const auto& b = host.devices[order[i]].coords;
    EXPECT_EQ(std::abs(a[0] - b[0]) + std::abs(a[1] - b[1]), 1) << "step " << i;
  }
}

TEST(PinRuntimeTest, PinsTheFirstHostAndExplainsEveryExclusion) {
  std::vector<WorkerInfo> hosts = {
      CpuHost("h-cpu", 2, 4, 20),
      TpuHost("h-old", 1, Block(0, 2, 2), 2, Tpu("0.0.36")),
      TpuHost("h-new", 0, Block(0, 0, 2), 2, Tpu("0.0.37")),
      WorkerInfo{.host = "h-none", .worker_index = 3},
      WorkerInfo{.host = "h-empty", .worker_index = 4, .runtime = Tpu("0.0.37")},
  };
  PinResult result = PinRuntime(hosts, {});
  EXPECT_EQ(result.pin, Tpu("0.0.37"));
  ASSERT_EQ(result.eligible.size(), 1u);
  EXPECT_EQ(result.eligible[0].host, "h-new");
  ASSERT_EQ(result.excluded.size(), 4u);
  EXPECT_EQ(result.excluded[0].host, "h-old");
  EXPECT_EQ(result.excluded[0].reason,
            "runtime " + runtime::ToString(Tpu("0.0.36")) + " differs from the job's pin " +
                runtime::ToString(Tpu("0.0.37")) + " (platform version, plugin sha256)");
  EXPECT_EQ(result.excluded[1].host, "h-cpu");
  EXPECT_EQ(result.excluded[1].reason,
            "runtime cpu 0.81 (PJRT 0.67, plugin 1a2b3c4d) differs from the job's pin "
            "tpu 0.0.37 (PJRT 0.67, plugin 9f8e7d6c) (platform, platform version, plugin sha256)");
  EXPECT_EQ(result.excluded[2].host, "h-none");
  EXPECT_EQ(result.excluded[2].reason, "no runtime loaded");
  EXPECT_EQ(result.excluded[3].host, "h-empty");
  EXPECT_NE(result.excluded[3].reason.find("no devices"), std::string::npos);

  // An explicit pin wins over host order, and the eligible hosts plan cleanly.
  result = PinRuntime(hosts, Tpu("0.0.36"));
  ASSERT_EQ(result.eligible.size(), 1u);
  EXPECT_EQ(result.eligible[0].host, "h-old");
  EXPECT_TRUE(PlanMesh({.tp = 4}, result.eligible).ok());

  // Nothing usable: nothing eligible, the pin stays empty.
  result = PinRuntime({WorkerInfo{.host = "x"}}, {});
  EXPECT_TRUE(result.pin.empty());
  EXPECT_TRUE(result.eligible.empty());
  ASSERT_EQ(result.excluded.size(), 1u);
}

}  // namespace
}  // namespace meshrun::coordinator

namespace meshrun::coordinator {
namespace {

// CPU hosts as registered: each numbers its own devices from 0.
std::vector<WorkerInfo> CpuFleet() {
  return {CpuHost("host-a", 0, 4, 0), CpuHost("host-b", 1, 4, 0), CpuHost("host-8", 2, 8, 0),
          CpuHost("host-c", 3, 4, 0)};
}

TEST(PlanCpuJobTest, OneHostTakesTheFirstFreeHostTheMeshFits) {
  absl::StatusOr<MeshPlan> plan = PlanCpuJob({.dp = 8}, 1, CpuFleet(), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->hosts, std::vector<std::string>{"host-8"});
  EXPECT_EQ(plan->device_hosts, std::vector<std::string>(8, "host-8"));
  EXPECT_TRUE(plan->replica_hosts.empty());
  plan = PlanCpuJob({.dp = 4}, 1, CpuFleet(), {"host-a"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->hosts, std::vector<std::string>{"host-b"});
}

TEST(PlanCpuJobTest, ReplicasRunOneHostsMeshOnEachHost) {
  absl::StatusOr<MeshPlan> plan = PlanCpuJob({.dp = 4}, 2, CpuFleet(), {});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->replica_hosts, (std::vector<std::string>{"host-a", "host-b"}));
  EXPECT_EQ(plan->hosts, plan->replica_hosts);
  EXPECT_EQ(plan->device_ids, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_TRUE(plan->device_hosts.empty());
  EXPECT_EQ(plan->shape, std::vector<int64_t>{4});
  EXPECT_EQ(plan->ToString(), "data=4 on each of 2 hosts (data-parallel, " +
                                  runtime::ToString(Cpu()) + ")");
  // A busy host is passed over for the next that fits; host-8 never fits dp=4.
  plan = PlanCpuJob({.dp = 4}, 2, CpuFleet(), {"host-b"});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->replica_hosts, (std::vector<std::string>{"host-a", "host-c"}));
}

TEST(PlanCpuJobTest, SaysWhyHostsWerePassedOver) {
  absl::StatusOr<MeshPlan> plan = PlanCpuJob({.dp = 4}, 4, CpuFleet(), {});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(plan.status().message().find("needs 4 CPU hosts"), std::string::npos);
  EXPECT_NE(plan.status().message().find("3 found"), std::string::npos);
  EXPECT_NE(plan.status().message().find("host-8: "), std::string::npos) << plan.status();
  // Enough hosts fit, but one is busy: retry later.
  plan = PlanCpuJob({.dp = 4}, 3, CpuFleet(), {"host-c"});
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kUnavailable) << plan.status();
  EXPECT_NE(plan.status().message().find("host-c: running another job"), std::string::npos);
  EXPECT_EQ(PlanCpuJob({.dp = 4}, 0, CpuFleet(), {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace meshrun::coordinator
