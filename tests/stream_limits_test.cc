// limits (issue 16): a real coordinator on 127.0.0.1:0 caps its concurrent telemetry streams
// (--max_watch_streams, --max_upload_streams); past a cap a stream is refused with
// RESOURCE_EXHAUSTED naming the flag, and a closed stream frees its slot.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/time/clock.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "coordinator_service/coordinator_server.h"
#include "rpc/server_support.h"

namespace meshrun::services {
namespace {

class StreamLimitsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    CoordinatorServer::Config config{.listen = "127.0.0.1:0",
                                     .state_dir = ::testing::TempDir() + "/stream_limits_test"};
    config.limits.max_watch_streams = 1;
    config.limits.max_upload_streams = 1;
    auto server = CoordinatorServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    v1::JobSpec spec;  // a job whose telemetry is watchable: a watch on it stays open
    v1::TelemetryDeclaration* loss = spec.add_telemetry();
    loss->set_name("loss");
    loss->set_combine(v1::COMBINE_MEAN);
    ASSERT_TRUE(server_->telemetry().DeclareJob("job-1", spec).ok());
    stub_ = v1::Coordinator::NewStub(MakeChannel("127.0.0.1:" + std::to_string(server_->port())));
  }

  // A watch of job-1 given `wait`: DEADLINE_EXCEEDED when the server kept it open.
  grpc::Status Watch(absl::Duration wait) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + wait));
    v1::WatchTelemetryRequest request;
    request.set_job_id("job-1");
    auto reader = stub_->WatchTelemetry(&context, request);
    v1::GlobalSummary summary;
    while (reader->Read(&summary)) {
    }
    return reader->Finish();
  }

  // An upload stream that sends nothing and closes: OK when the server took it.
  grpc::Status Upload() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    auto stream = stub_->UploadTelemetry(&context);
    stream->WritesDone();
    v1::UploadTelemetryAck ack;
    while (stream->Read(&ack)) {
    }
    return stream->Finish();
  }

  // Calls `attempt` until its status has `code` (the server's count of streams lags the
  // clients' by a hop, longer under sanitizers), for up to 10 s; returns the last status.
  static grpc::Status Until(grpc::StatusCode code, const std::function<grpc::Status()>& attempt) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    grpc::Status status = attempt();
    while (status.error_code() != code && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(20));
      status = attempt();
    }
    return status;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(StreamLimitsTest, WatchStreamsPastTheCapAreRefused) {
  grpc::ClientContext held;
  v1::WatchTelemetryRequest request;
  request.set_job_id("job-1");
  auto reader = stub_->WatchTelemetry(&held, request);
  for (int i = 0; i < 500 && server_->telemetry().hub().WatcherCount("job-1") == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(server_->telemetry().hub().WatcherCount("job-1"), 1);
  const grpc::Status refused = Until(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                     [&] { return Watch(absl::Milliseconds(200)); });
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("--max_watch_streams"), std::string::npos)
      << refused.error_message();
  // Uploads have their own cap: one is still taken.
  EXPECT_TRUE(Upload().ok());
  held.TryCancel();
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  // The slot is free again: a watch is kept open until its deadline.
  const grpc::Status kept = Until(grpc::StatusCode::DEADLINE_EXCEEDED,
                                  [&] { return Watch(absl::Milliseconds(200)); });
  EXPECT_EQ(kept.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << kept.error_message();
}

TEST_F(StreamLimitsTest, UploadStreamsPastTheCapAreRefused) {
  grpc::ClientContext held;
  auto stream = stub_->UploadTelemetry(&held);
  absl::SleepFor(absl::Milliseconds(100));  // the server takes it before the next ones
  const grpc::Status refused =
      Until(grpc::StatusCode::RESOURCE_EXHAUSTED, [&] { return Upload(); });
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.error_message();
  EXPECT_NE(refused.error_message().find("--max_upload_streams"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(Watch(absl::Milliseconds(200)).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  const grpc::Status taken = Until(grpc::StatusCode::OK, [&] { return Upload(); });
  EXPECT_TRUE(taken.ok()) << taken.error_message();
}

}  // namespace
}  // namespace meshrun::services
