// HostAllReduce rendezvous through a real coordinator's key-value store (KeyValue RPCs on
// 127.0.0.1:0), one RPC client per rank as on two hosts; gloo's traffic over loopback TCP.
#include <gtest/gtest.h>

#include <thread>

#include "absl/strings/match.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "worker_service/coordinator_kv_client.h"
#include "coordinator_service/coordinator_server.h"
#include "rpc/server_support.h"
#include "worker/collectives/host_allreduce.h"

namespace meshrun::worker::collectives {
namespace {

using services::CoordinatorKeyValueClient;
using services::CoordinatorServer;
using services::MakeChannel;

class CollectivesCoordinatorTest : public testing::Test {
 protected:
  void SetUp() override {
    auto started = CoordinatorServer::Start(
        {.listen = "127.0.0.1:0",
         .state_dir = testing::TempDir() + "/collectives_coordinator_test"});
    ASSERT_TRUE(started.ok()) << started.status();
    coordinator_ = std::move(*started);
    address_ = "127.0.0.1:" + std::to_string(coordinator_->port());
  }

  HostAllReduce::Config RankConfig(int rank, int size, const std::string& prefix,
                                   absl::Duration timeout) {
    return {.rank = rank,
            .size = size,
            .store = std::make_shared<CoordinatorKeyValueClient>(MakeChannel(address_)),
            .prefix = prefix,
            .timeout = timeout,
            .peer_names = {"host-a", "host-b"}};
  }

  // Keys left under `directory` in the coordinator's store.
  int KeysUnder(const std::string& directory) {
    auto stub = v1::Coordinator::NewStub(MakeChannel(address_));
    v1::KeyValueListRequest request;
    request.set_directory(directory);
    v1::KeyValueListResponse response;
    auto context = services::ContextWithTimeout(absl::Seconds(5));
    EXPECT_TRUE(stub->KeyValueList(context.get(), request, &response).ok());
    return response.entries_size();
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
  std::string address_;
};

TEST_F(CollectivesCoordinatorTest, TwoRanksRendezvousThroughTheCoordinatorAndAllReduce) {
  const std::string prefix = "collectives/job-1/0";
  std::vector<std::unique_ptr<HostAllReduce>> ranks(2);
  std::vector<std::vector<float>> data(2);
  std::vector<absl::Status> statuses(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto created = HostAllReduce::Create(RankConfig(r, 2, prefix, absl::Seconds(20)));
      if (!created.ok()) {
        statuses[r] = created.status();
        return;
      }
      ranks[r] = std::move(*created);
      data[r].assign(100'000, 0.0f);
      for (size_t i = 0; i < data[r].size(); ++i) data[r][i] = static_cast<float>(i % 50 + r);
      statuses[r] = ranks[r]->AllReduce({absl::MakeSpan(data[r])}, ReduceOp::kMean);
    });
  }
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(statuses[r].ok()) << statuses[r];
    for (size_t i = 0; i < data[r].size(); ++i) {
      ASSERT_EQ(data[r][i], static_cast<float>(i % 50) + 0.5f) << "rank " << r << " at " << i;
    }
  }
  EXPECT_EQ(KeysUnder(prefix), 0);  // rendezvous keys are deleted once everyone connected
}

TEST_F(CollectivesCoordinatorTest, AbsentRankIsNamedAfterTheTimeout) {
  const absl::Time start = absl::Now();
  auto created =
      HostAllReduce::Create(RankConfig(0, 2, "collectives/job-2/0", absl::Milliseconds(300)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kDeadlineExceeded) << created.status();
  EXPECT_TRUE(absl::StrContains(created.status().message(), "rank 1 (host-b) did not arrive"))
      << created.status();
  EXPECT_EQ(KeysUnder("collectives/job-2/0"), 0);
}

TEST_F(CollectivesCoordinatorTest, UnreachableStoreIsUnavailable) {
  HostAllReduce::Config config = RankConfig(0, 2, "collectives/job-3/0", absl::Seconds(1));
  coordinator_.reset();
  auto created = HostAllReduce::Create(std::move(config));
  ASSERT_FALSE(created.ok());
  EXPECT_EQ(created.status().code(), absl::StatusCode::kUnavailable) << created.status();
}

}  // namespace
}  // namespace meshrun::worker::collectives
