// A watch alone on its connection gets a burst of summaries whole, in order and at once, both
// live and from history (a real coordinator on 127.0.0.1:0), on WatchTelemetry and on
// WatchTelemetryBatches. It guards the watch stream's one write in flight: gRPC 1.51 completes
// a write sent with the buffer hint only once a later write flushes it, so hinting "more
// queued" (tried for issue 19) stalled a backfill until the deadline. And it checks the
// batches: what is queued goes in few messages, within the batch limits.
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
#include "coordinator_service/coordinator_server.h"
#include "rpc/server_support.h"

namespace meshrun::services {
namespace {

constexpr int kBurst = 200;  // below the per-watcher queue (256): nothing overflows
constexpr int kMaxBatch = 64;  // summaries per batch (coordinator_service/watch_stream.cc)

// The stream read: its steps in order, and how many summaries each message held.
struct Received {
  std::vector<int64_t> steps;
  std::vector<int> per_message;
};

class WatchBurstTest : public ::testing::TestWithParam<bool> {  // true: WatchTelemetryBatches
 protected:
  void SetUp() override {
    std::string dir = ::testing::TempDir() + "watch_burst_test.XXXXXX";
    ASSERT_NE(mkdtemp(dir.data()), nullptr);
    dir_ = dir;
    auto server = CoordinatorServer::Start({.listen = "127.0.0.1:0", .state_dir = dir_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    StartJob("job-1", 0);
  }
  // A job of one host "h" reporting `loss` and, when `weights` > 0, a series of that many
  // elements.
  void StartJob(const std::string& job_id, int weights) {
    v1::JobManifest job;
    job.set_job_id(job_id);
    (*job.mutable_host_incarnations())["h"] = "h-1";
    job.mutable_mesh()->add_shape(1);
    v1::TelemetryDeclaration* loss = job.mutable_spec()->add_telemetry();
    loss->set_name("loss");
    loss->set_combine(v1::COMBINE_MEAN);
    if (weights > 0) {
      v1::TelemetryDeclaration* declared = job.mutable_spec()->add_telemetry();
      declared->set_name("weights");
      declared->add_shape(weights);
      declared->set_combine(v1::COMBINE_MEAN);
    }
    ASSERT_TRUE(server_->telemetry().DeclareJob(job_id, job.spec()).ok());
    ASSERT_TRUE(server_->telemetry().StartJob(job).ok());
  }
  void TearDown() override {
    server_.reset();
    std::filesystem::remove_all(dir_);
  }

  void Burst(int from, int to, const std::string& job_id = "job-1", int weights = 0) {
    for (int step = from; step <= to; ++step) {
      v1::HostSummary summary;
      summary.set_job_id(job_id);
      summary.set_host("h");
      summary.set_step(step);
      summary.set_replica_count(1);
      v1::TelemetryValue* value = summary.add_values();
      value->set_name("loss");
      value->add_values(static_cast<float>(step));
      if (weights > 0) {
        v1::TelemetryValue* series = summary.add_values();
        series->set_name("weights");
        series->add_shape(weights);
        series->mutable_values()->Resize(weights, 0.5f);
      }
      const auto accepted = server_->telemetry().Accept(summary);
      ASSERT_TRUE(accepted.ok()) << "step " << step << ": " << accepted.status();
    }
  }

  // A watch from `since_step` on a connection of its own (batched or not, by the test's
  // parameter); returns what was read before `expect` summaries arrived or 10 s passed.
  Received Read(int64_t since_step, int expect, const std::string& job_id = "job-1") {
    grpc::ChannelArguments args;
    args.SetString("meshrun.test.channel", absl::StrCat("watch-", since_step));
    auto stub = v1::Coordinator::NewStub(
        grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", server_->port()),
                                  grpc::InsecureChannelCredentials(), args));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::WatchTelemetryRequest request;
    request.set_job_id(job_id);
    request.set_since_step(since_step);
    Received got;
    if (GetParam()) {
      auto reader = stub->WatchTelemetryBatches(&context, request);
      v1::GlobalSummaryBatch batch;
      while (static_cast<int>(got.steps.size()) < expect && reader->Read(&batch)) {
        for (const v1::GlobalSummary& summary : batch.summaries()) {
          got.steps.push_back(summary.step());
        }
        got.per_message.push_back(batch.summaries_size());
      }
      context.TryCancel();
      reader->Finish();
    } else {
      auto reader = stub->WatchTelemetry(&context, request);
      v1::GlobalSummary summary;
      while (static_cast<int>(got.steps.size()) < expect && reader->Read(&summary)) {
        got.steps.push_back(summary.step());
        got.per_message.push_back(1);
      }
      context.TryCancel();
      reader->Finish();
    }
    return got;
  }

  static std::vector<int64_t> Steps(int from, int to) {
    std::vector<int64_t> steps;
    for (int step = from; step <= to; ++step) steps.push_back(step);
    return steps;
  }

  std::string dir_;
  std::unique_ptr<CoordinatorServer> server_;
};

TEST_P(WatchBurstTest, LiveBurstArrivesWholeAndPromptly) {
  Received got;
  std::thread reader([&] { got = Read(1, kBurst); });
  // The watch subscribes before the burst, so every summary goes through its live queue.
  for (int i = 0; i < 500 && server_->telemetry().hub().WatcherCount("job-1") == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(server_->telemetry().hub().WatcherCount("job-1"), 1);
  const absl::Time start = absl::Now();
  Burst(1, kBurst);
  reader.join();
  EXPECT_EQ(got.steps, Steps(1, kBurst));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8)) << "the last writes waited for a flush";
  for (int n : got.per_message) EXPECT_LE(n, kMaxBatch);
}

TEST_P(WatchBurstTest, HistoryBackfillArrivesWhole) {
  Burst(1, kBurst);
  const absl::Time start = absl::Now();
  const Received got = Read(1, kBurst);
  EXPECT_EQ(got.steps, Steps(1, kBurst));
  EXPECT_LT(absl::Now() - start, absl::Seconds(8)) << "the last writes waited for a flush";
  if (GetParam()) {  // all of it was waiting: full batches, the last one the remainder
    EXPECT_EQ(got.per_message, (std::vector<int>{kMaxBatch, kMaxBatch, kMaxBatch,
                                                 kBurst - 3 * kMaxBatch}));
  }
}

TEST_P(WatchBurstTest, LargeSummariesAreBatchedWithinAboutOneMebibyte) {
  // 200 KB summaries: five fit in 1 MiB, so 12 come as three batches of 5, 5 and 2.
  StartJob("job-2", 50000);
  Burst(1, 12, "job-2", 50000);
  const Received got = Read(1, 12, "job-2");
  EXPECT_EQ(got.steps, Steps(1, 12));
  if (GetParam()) {
    EXPECT_EQ(got.per_message, (std::vector<int>{5, 5, 2}));
  }
}

INSTANTIATE_TEST_SUITE_P(OnePerMessageAndBatches, WatchBurstTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Batches" : "OnePerMessage";
                         });

}  // namespace
}  // namespace meshrun::services
