// AllReduceDeviceBuffers with the real CPU PJRT plugin: two ranks in one process, each with
// its own PJRT client of 2 devices, as two hosts would have; gloo over loopback TCP.
#include "worker/collectives/device_allreduce.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <thread>

#include "absl/strings/match.h"
#include "runtime/backends.h"

namespace meshrun::worker::collectives {
namespace {

using runtime::DeviceBuffer;
using runtime::DType;
using runtime::HostArray;
using runtime::Runtime;

class DeviceAllReduceTest : public testing::Test {
 protected:
  void SetUp() override {
    const std::string plugin = runtime::DefaultPjrtPluginPath();
    struct stat st;
    if (stat(plugin.c_str(), &st) != 0) {
      GTEST_SKIP() << "PJRT CPU plugin missing: " << plugin << " (run scripts/fetch_pjrt.sh)";
    }
    ASSERT_TRUE(runtime::RegisterRuntimes(registry_).ok());
    for (auto& runtime : runtimes_) {
      auto created = registry_.Create(
          "pjrt", runtime::RuntimeConfig{.plugin_path = plugin, .cpu_device_count = 2});
      ASSERT_TRUE(created.ok()) << created.status();
      runtime = std::move(*created);
    }
  }

  // Rank r's gradient-like buffers: f32[3,4] on device 0 and f32[1000] on device 1.
  static std::vector<std::unique_ptr<DeviceBuffer>> Upload(Runtime& runtime, int r) {
    std::vector<float> a(12), b(1000);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i) + 10.0f * r;
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 7) - 3.0f * r;
    std::vector<std::unique_ptr<DeviceBuffer>> out;
    out.push_back(runtime.ToDevice(HostArray::From(DType::kF32, {3, 4}, a), 0).value());
    out.push_back(runtime.ToDevice(HostArray::From(DType::kF32, {1000}, b), 1).value());
    return out;
  }

  runtime::RuntimeRegistry registry_;
  std::unique_ptr<Runtime> runtimes_[2];
};

TEST_F(DeviceAllReduceTest, MeanOfTwoRanksLandsOnTheSameDevicesAndIsCounted) {
  auto store = std::make_shared<runtime::InMemoryKeyValueClient>();
  Metrics metrics[2];
  std::vector<std::vector<std::unique_ptr<DeviceBuffer>>> inputs(2), outputs(2);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto allreduce = HostAllReduce::Create(
          {.rank = r, .size = 2, .store = store, .prefix = "collectives/device/0"});
      if (!allreduce.ok()) {
        statuses[r] = allreduce.status();
        return;
      }
      inputs[r] = Upload(*runtimes_[r], r);
      std::vector<DeviceBuffer*> grads = {inputs[r][0].get(), inputs[r][1].get()};
      auto reduced = AllReduceDeviceBuffers(*runtimes_[r], **allreduce, grads,
                                            {.op = ReduceOp::kMean, .metrics = &metrics[r]});
      if (!reduced.ok()) {
        statuses[r] = reduced.status();
        return;
      }
      outputs[r] = std::move(*reduced);
    });
  }
  for (std::thread& t : threads) t.join();

  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    ASSERT_EQ(outputs[r].size(), 2u);
    EXPECT_EQ(outputs[r][0]->device_index(), 0);
    EXPECT_EQ(outputs[r][1]->device_index(), 1);
    EXPECT_EQ(outputs[r][0]->shape(), inputs[r][0]->shape());
    EXPECT_FALSE(inputs[r][0]->IsDeleted());
    const std::vector<float> a = runtimes_[r]->ToHost(*outputs[r][0]).value().As<float>();
    const std::vector<float> b = runtimes_[r]->ToHost(*outputs[r][1]).value().As<float>();
    ASSERT_EQ(a.size(), 12u);
    ASSERT_EQ(b.size(), 1000u);
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(a[i], static_cast<float>(i) + 5.0f);
    for (size_t i = 0; i < b.size(); ++i) ASSERT_EQ(b[i], static_cast<float>(i % 7) - 1.5f);

    const int64_t bytes = (12 + 1000) * 4;
    EXPECT_EQ(metrics[r].Get(kAllReduceBytes).count, 1);
    EXPECT_EQ(metrics[r].Get(kAllReduceBytes).total, bytes);
    EXPECT_EQ(metrics[r].Get(kAllReduceTime).count, 1);
    EXPECT_EQ(metrics[r].Get(kTransferFromDeviceBytes).count, 2);
    EXPECT_EQ(metrics[r].Get(kTransferFromDeviceBytes).total, bytes);
    EXPECT_EQ(metrics[r].Get(kTransferToDeviceBytes).count, 2);
    EXPECT_EQ(metrics[r].Get(kTransferToDeviceBytes).total, bytes);
  }
}

// Rank r holds f32[100] on each of its 2 devices: i + 10 r (+ 1000 d unless replicated);
// AllReduceInPlace sums them across the two ranks.
class InPlaceTest : public DeviceAllReduceTest, public testing::WithParamInterface<bool> {};

TEST_P(InPlaceTest, EveryDeviceGetsTheSumOfItsCounterparts) {
  const bool replicated = GetParam();
  auto store = std::make_shared<runtime::InMemoryKeyValueClient>();
  Metrics metrics[2];
  std::vector<PerDeviceBuffers> buffers(2);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto allreduce = HostAllReduce::Create(
          {.rank = r, .size = 2, .store = store, .prefix = "collectives/in-place/0"});
      if (!allreduce.ok()) {
        statuses[r] = allreduce.status();
        return;
      }
      buffers[r].resize(2);
      for (int d = 0; d < 2; ++d) {
        std::vector<float> values(100);
        for (size_t i = 0; i < values.size(); ++i) {
          values[i] = static_cast<float>(i + 10 * r + (replicated ? 0 : 1000 * d));
        }
        buffers[r][d].push_back(
            runtimes_[r]->ToDevice(HostArray::From(DType::kF32, {100}, values), d).value());
      }
      statuses[r] = AllReduceInPlace(*runtimes_[r], **allreduce, buffers[r],
                                     {.op = ReduceOp::kSum,
                                      .replicated_across_devices = replicated,
                                      .metrics = &metrics[r]});
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    for (int d = 0; d < 2; ++d) {
      ASSERT_EQ(buffers[r][d].size(), 1u);
      EXPECT_EQ(buffers[r][d][0]->device_index(), d);
      const std::vector<float> got = runtimes_[r]->ToHost(*buffers[r][d][0]).value().As<float>();
      ASSERT_EQ(got.size(), 100u);
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i], static_cast<float>(2 * i + 10 + (replicated ? 0 : 2000 * d)));
      }
    }
    // Replicated: one copy crosses hosts and is uploaded to both devices.
    EXPECT_EQ(metrics[r].Get(kTransferFromDeviceBytes).count, replicated ? 1 : 2);
    EXPECT_EQ(metrics[r].Get(kAllReduceBytes).total, replicated ? 400 : 800);
    EXPECT_EQ(metrics[r].Get(kTransferToDeviceBytes).count, 2);
  }
}

INSTANTIATE_TEST_SUITE_P(Replication, InPlaceTest, testing::Bool());

TEST_F(DeviceAllReduceTest, NonF32BufferIsRefusedNamingIt) {
  auto allreduce = HostAllReduce::Create({.rank = 0, .size = 1});
  ASSERT_TRUE(allreduce.ok()) << allreduce.status();
  Runtime& runtime = *runtimes_[0];
  auto f32 = runtime.ToDevice(HostArray::From(DType::kF32, {2}, std::vector<float>{1, 2}), 0);
  auto s32 = runtime.ToDevice(HostArray::From(DType::kS32, {2}, std::vector<int32_t>{1, 2}), 1);
  ASSERT_TRUE(f32.ok() && s32.ok());
  Metrics metrics;
  auto reduced = AllReduceDeviceBuffers(runtime, **allreduce, {f32->get(), s32->get()},
                                        {.metrics = &metrics});
  ASSERT_FALSE(reduced.ok());
  EXPECT_EQ(reduced.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(reduced.status().message(), "buffer 1 is s32[2]"))
      << reduced.status();
  EXPECT_TRUE(metrics.Snapshot().empty());  // refused before any transfer
}

TEST_F(DeviceAllReduceTest, ReplicatedNeedsTheSameArraysOnEveryDevice) {
  auto allreduce = HostAllReduce::Create({.rank = 0, .size = 1});
  ASSERT_TRUE(allreduce.ok()) << allreduce.status();
  PerDeviceBuffers buffers(2);
  const HostArray values = HostArray::From(DType::kF32, {2}, std::vector<float>{1, 2});
  buffers[0].push_back(runtimes_[0]->ToDevice(values, 0).value());
  absl::Status status = AllReduceInPlace(*runtimes_[0], **allreduce, buffers,
                                         {.replicated_across_devices = true});
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_TRUE(absl::StrContains(status.message(), "device list 1")) << status;
  EXPECT_EQ(buffers[0].size(), 1u);  // left as it was
}

}  // namespace
}  // namespace meshrun::worker::collectives
