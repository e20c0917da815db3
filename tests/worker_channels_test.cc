// The coordinator's shared channels to its workers, against a real worker on 127.0.0.1:0: a
// worker's calls reuse one channel, KeepOnly closes the channels of workers no longer alive at
// their address, and a call holding a dropped channel still completes on it.
#include <gtest/gtest.h>

#include <filesystem>

#include "coordinator_service/worker_channels.h"
#include "worker_service/worker_server.h"

namespace meshrun::services {
namespace {

class WorkerChannelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/worker_channels_test";
    std::filesystem::remove_all(dir_);
    // No coordinator listens on port 1: the worker keeps retrying registration, which does
    // not matter to GetStatus.
    auto worker = WorkerServer::Start({.listen = "127.0.0.1:0",
                                       .coordinator = "127.0.0.1:1",
                                       .identity = {.host = "w-0"},
                                       .state_dir = dir_});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = std::move(*worker);
    address_ = "127.0.0.1:" + std::to_string(worker_->port());
  }
  void TearDown() override {
    if (worker_ != nullptr) worker_->Drain(absl::Seconds(1));
    std::filesystem::remove_all(dir_);
  }
  static grpc::Status Status(const WorkerChannels::Worker& worker) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::WorkerStatusReport report;
    return worker->GetStatus(&context, v1::GetStatusRequest(), &report);
  }

  std::string dir_;
  std::string address_;
  std::unique_ptr<WorkerServer> worker_;
};

TEST_F(WorkerChannelsTest, AWorkersCallsShareOneChannel) {
  WorkerChannels channels;
  const WorkerChannels::Worker first = channels.At("w-0", address_);
  ASSERT_TRUE(Status(first).ok()) << Status(first).error_message();
  const WorkerChannels::Worker again = channels.At("w-0", address_);
  EXPECT_EQ(first.channel(), again.channel());
  EXPECT_TRUE(Status(again).ok());
  // Another host name at the same address is another member: its own channel (which, under
  // TLS, expects that host's certificate).
  EXPECT_NE(channels.At("w-1", address_).channel(), first.channel());
  EXPECT_EQ(channels.size(), 2u);
}

TEST_F(WorkerChannelsTest, KeepOnlyClosesOthersAndAHeldChannelStillWorks) {
  WorkerChannels channels;
  const WorkerChannels::Worker held = channels.At("w-0", address_);
  ASSERT_TRUE(Status(held).ok());
  channels.At("gone", "127.0.0.1:1");
  EXPECT_EQ(channels.KeepOnly({WorkerChannels::Key("w-0", address_)}), 1);
  EXPECT_EQ(channels.size(), 1u);
  EXPECT_EQ(channels.At("w-0", address_).channel(), held.channel());

  EXPECT_EQ(channels.KeepOnly({}), 1);
  EXPECT_EQ(channels.size(), 0u);
  EXPECT_TRUE(Status(held).ok());  // the handle keeps its channel
  const WorkerChannels::Worker fresh = channels.At("w-0", address_);
  EXPECT_NE(fresh.channel(), held.channel());
  EXPECT_TRUE(Status(fresh).ok());
}

}  // namespace
}  // namespace meshrun::services
