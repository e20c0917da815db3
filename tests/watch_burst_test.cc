// A watch alone on its connection gets a burst of summaries whole, in order and at once, both
// live and from history (a real coordinator on 127.0.0.1:0). It guards the watch stream's one
// write in flight: gRPC 1.51 completes a write sent with the buffer hint only once a later write
// flushes it, so hinting "more queued" (tried for issue 19) stalled a backfill until the
// deadline.
#include <gtest/gtest.h>

#include <stdlib.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "services/coordinator_server.h"
#include "services/server_support.h"

namespace meshrun::services {
namespace {

constexpr int kBurst = 200;  // below the per-watcher queue (256): nothing overflows

class WatchBurstTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir() + "watch_burst_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    auto server = CoordinatorServer::Start({.listen = "127.0.0.1:0", .state_dir = dir_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    v1::JobManifest job;
    job.set_job_id("job-1");
    (*job.mutable_host_incarnations())["h"] = "h-1";
    job.mutable_mesh()->add_shape(1);
    v1::TelemetryDeclaration* loss = job.mutable_spec()->add_telemetry();
    loss->set_name("loss");
    loss->set_combine(v1::COMBINE_MEAN);
    ASSERT_TRUE(server_->telemetry().DeclareJob("job-1", job.spec()).ok());
    ASSERT_TRUE(server_->telemetry().StartJob(job).ok());
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Burst(int from, int to) {
    for (int step = from; step <= to; ++step) {
      v1::HostSummary summary;
      summary.set_job_id("job-1");
      summary.set_host("h");
      summary.set_step(step);
      summary.set_replica_count(1);
      v1::TelemetryValue* value = summary.add_values();
      value->set_name("loss");
      value->add_values(static_cast<float>(step));
      ASSERT_TRUE(server_->telemetry().Accept(summary).ok()) << "step " << step;
    }
  }

  // A watch from `since_step` on a connection of its own; returns the steps read before
  // `expect` arrived or 10 s passed.
  std::vector<int64_t> Read(int64_t since_step, int expect) {
    grpc::ChannelArguments args;
    args.SetString("meshrun.test.channel", absl::StrCat("watch-", since_step));
    auto stub = v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                  grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::WatchTelemetryRequest request;
    request.set_job_id("job-1");
    request.set_since_step(since_step);
    auto reader = stub->WatchTelemetry(&context, request);
    std::vector<int64_t> steps;
    v1::GlobalSummary summary;
    while (static_cast<int>(steps.size()) < expect && reader->Read(&summary)) {
      steps.push_back(summary.step());
    }
    context.TryCancel();
    reader->Finish();
    return steps;
  }

  static std::vector<int64_t> Steps(int from, int to) {
    std::vector<int64_t> steps;
    for (int step = from; step <= to; ++step) steps.push_back(step);
    return steps;
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
};

TEST_F(WatchBurstTest, LiveBurstArrivesWholeAndPromptly) {
  std::vector<int64_t> steps;
  std::thread reader([&] { steps = Read(1, kBurst); });
  // The watch subscribes before the burst, so every summary goes through its live queue.
  for (int i = 0; i < 500 && server_->telemetry().hub().WatcherCount("job-1") == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(server_->telemetry().hub().WatcherCount("job-1"), 1);
  const absl::Time start = absl::Now();
  Burst(1, kBurst);
  reader.join();
  EXPECT_EQ(steps, Steps(1, kBurst));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8)) << "the last writes waited for a flush";
}

TEST_F(WatchBurstTest, HistoryBackfillArrivesWhole) {
  Burst(1, kBurst);
  const absl::Time start = absl::Now();
  EXPECT_EQ(Read(1, kBurst), Steps(1, kBurst));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8)) << "the last writes waited for a flush";
}

}  // namespace
}  // namespace meshrun::services
