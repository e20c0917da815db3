// No blocking on gRPC callback threads (issue 16, faults): a real coordinator on 127.0.0.1:0
// with a registered worker whose address is a black hole (a socket that listens and never
// answers, so every call to it waits for its 5 s deadline). While many GetDeviceMemory,
// GetMetrics and DrainWorker calls wait on that worker, a heartbeat and cheap calls (GetJob,
// ListWorkers) are answered promptly, and the slow calls still end with their usual codes.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "coordinator_service/coordinator_server.h"
#include "rpc/server_support.h"
#include "testing/black_hole.h"

namespace meshrun::services {
namespace {

constexpr char kHost[] = "slow-host";
constexpr char kIncarnation[] = "slow-1";
// What a cheap call may take while the slow calls wait: generous for sanitizer builds on two
// shared cores, far below the slow calls' 5 s.
constexpr absl::Duration kPrompt = absl::Milliseconds(1500);
constexpr int kSlowCalls = 48;  // per kind

// A channel of its own (a distinct argument keeps gRPC from sharing a connection), so the
// probes never queue behind the slow calls' streams on the client side.
std::unique_ptr<v1::Coordinator::Stub> Stub(int port, const std::string& tag) {
  grpc::ChannelArguments args;
  args.SetString("meshrun.test.channel", tag);
  return v1::Coordinator::NewStub(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
}

std::unique_ptr<grpc::ClientContext> Context(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

TEST(CallbackThreadsTest, CheapCallsAreAnsweredWhileSlowCallsWaitOnAHungWorker) {
  testing::BlackHole hole;
  ASSERT_NE(hole.port(), 0) << "cannot listen on loopback";
  auto server = CoordinatorServer::Start(
      {.listen = "127.0.0.1:0", .state_dir = ::testing::TempDir() + "/callback_threads_test"});
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  auto probe = Stub(port, "probe");
  {
    v1::RegisterWorkerRequest request;
    v1::WorkerRegistration* registration = request.mutable_registration();
    registration->mutable_protocol()->set_version(1);
    registration->set_host(kHost);
    registration->set_address(absl::StrCat("127.0.0.1:", hole.port()));
    registration->set_incarnation(kIncarnation);
    v1::RegisterWorkerResponse response;
    ASSERT_TRUE(probe->RegisterWorker(Context(absl::Seconds(5)).get(), request, &response).ok());
  }

  // The slow calls: each waits on the black hole for the coordinator's 5 s deadline.
  std::vector<grpc::Status> device_memory(kSlowCalls), drains(kSlowCalls);
  std::vector<grpc::Status> metrics(kSlowCalls);
  std::atomic<int> ended{0};
  // What ended before the probes ran, for the failure message: a slow call that ends early
  // says how, so a failure here names its cause.
  absl::Mutex early_mu;
  std::vector<std::string> early;
  std::atomic<bool> probing{false};
  const absl::Time launched = absl::Now();
  auto finished = [&](const char* kind, int i, const grpc::Status& status) {
    if (!probing.load()) {
      absl::MutexLock lock(&early_mu);
      early.push_back(absl::StrCat(kind, "[", i, "] after ",
                                   absl::FormatDuration(absl::Now() - launched), ": code ",
                                   status.error_code(), " ", status.error_message()));
    }
    ++ended;
  };
  std::vector<std::thread> callers;
  for (int i = 0; i < kSlowCalls; ++i) {
    callers.emplace_back([&, i] {
      auto stub = Stub(port, absl::StrCat("slow-", i));
      v1::GetDeviceMemoryRequest memory;
      memory.set_host(kHost);
      v1::GetDeviceMemoryResponse memory_response;
      device_memory[i] =
          stub->GetDeviceMemory(Context(absl::Seconds(60)).get(), memory, &memory_response);
      finished("GetDeviceMemory", i, device_memory[i]);
    });
    callers.emplace_back([&, i] {
      auto stub = Stub(port, absl::StrCat("slow-", i));
      v1::GetMetricsResponse response;
      metrics[i] = stub->GetMetrics(Context(absl::Seconds(60)).get(), v1::GetMetricsRequest(),
                                    &response);
      finished("GetMetrics", i, metrics[i]);
    });
    callers.emplace_back([&, i] {
      auto stub = Stub(port, absl::StrCat("slow-", i));
      v1::DrainWorkerRequest drain;
      drain.set_host(kHost);
      v1::DrainWorkerResponse response;
      drains[i] = stub->DrainWorker(Context(absl::Seconds(60)).get(), drain, &response);
      finished("DrainWorker", i, drains[i]);
    });
  }
  absl::SleepFor(absl::Milliseconds(500));  // the slow calls reach the coordinator and wait
  probing = true;
  {
    // Most slow calls must still be waiting, or the probes below would not compete with them.
    // A few ending early is tolerated (the codes are checked at the end) but always reported:
    // one did once in CI under ASan, and its cause is not yet known.
    absl::MutexLock lock(&early_mu);
    if (!early.empty()) {
      std::cerr << "slow calls that ended before the probes:\n" << absl::StrJoin(early, "\n")
                << "\n";
    }
    EXPECT_LT(early.size(), static_cast<size_t>(kSlowCalls))
        << "the slow calls did not wait on the hung worker";
  }

  // Meanwhile: heartbeats and cheap calls, each answered well within the slow calls' wait.
  absl::Duration slowest;
  for (int round = 0; round < 5; ++round) {
    const absl::Time start = absl::Now();
    v1::HeartbeatRequest heartbeat;
    heartbeat.set_host(kHost);
    heartbeat.set_incarnation(kIncarnation);
    v1::HeartbeatResponse heartbeat_response;
    const grpc::Status beat =
        probe->Heartbeat(Context(absl::Seconds(4)).get(), heartbeat, &heartbeat_response);
    EXPECT_TRUE(beat.ok()) << beat.error_message();
    v1::GetJobRequest get;
    get.set_job_id("job-404");
    v1::JobManifest job;
    EXPECT_EQ(probe->GetJob(Context(absl::Seconds(4)).get(), get, &job).error_code(),
              grpc::StatusCode::NOT_FOUND);
    v1::ListWorkersResponse workers;
    EXPECT_TRUE(probe->ListWorkers(Context(absl::Seconds(4)).get(), v1::ListWorkersRequest(),
                                   &workers).ok());
    slowest = std::max(slowest, absl::Now() - start);
    absl::SleepFor(absl::Milliseconds(200));
  }
  EXPECT_LT(slowest, kPrompt) << "a heartbeat and two cheap calls waited behind the slow calls";
  EXPECT_LT(ended.load(), 3 * kSlowCalls) << "the slow calls ended before the probes did";

  for (std::thread& caller : callers) caller.join();
  // The slow calls end as they did on the server thread: the worker's deadline, relayed.
  for (int i = 0; i < kSlowCalls; ++i) {
    EXPECT_EQ(device_memory[i].error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << device_memory[i].error_message();
    EXPECT_EQ(drains[i].error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << drains[i].error_message();
    EXPECT_TRUE(metrics[i].ok()) << metrics[i].error_message();  // a cluster view skips it
  }
}

}  // namespace
}  // namespace meshrun::services
