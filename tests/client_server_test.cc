// A real coordinator and real workers on 127.0.0.1:0, talking gRPC: registration, health,
// reflection, heartbeat timeout, and drain.
#include <gtest/gtest.h>

#include <algorithm>
#include <thread>

#include "absl/time/clock.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "worker_service/coordinator_kv_client.h"
#include "coordinator_service/coordinator_server.h"
#include "rpc/grpc_probe.h"
#include "rpc/server_support.h"
#include "worker_service/worker_server.h"

namespace meshrun::services {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(5);

std::string StateDir(const std::string& name) {
  return ::testing::TempDir() + "/client_server_test/" + name;
}

std::unique_ptr<WorkerServer> StartWorker(const std::string& host, int coordinator_port) {
  auto worker = WorkerServer::Start({.listen = "127.0.0.1:0",
                                     .advertise_address = "",
                                     .coordinator = "127.0.0.1:" + std::to_string(coordinator_port),
                                     .identity = {.host = host},
                                     .state_dir = StateDir(host)});
  EXPECT_TRUE(worker.ok()) << worker.status();
  return worker.ok() ? std::move(*worker) : nullptr;
}

v1::ListWorkersResponse ListWorkers(int port) {
  auto stub = v1::Coordinator::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port)));
  v1::ListWorkersResponse response;
  auto context = ContextWithTimeout(kTimeout);
  EXPECT_TRUE(stub->ListWorkers(context.get(), {}, &response).ok());
  return response;
}

// Polls until `predicate` holds on the coordinator's worker list, bounded by `limit`.
template <typename Predicate>
bool WaitForWorkers(int port, Predicate predicate, absl::Duration limit = absl::Seconds(10)) {
  const absl::Time give_up = absl::Now() + limit;
  while (absl::Now() < give_up) {
    if (predicate(ListWorkers(port))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

int CountInState(const v1::ListWorkersResponse& workers, v1::WorkerState state) {
  return static_cast<int>(std::count_if(workers.workers().begin(), workers.workers().end(),
                                        [&](const auto& w) { return w.state() == state; }));
}

TEST(ClientServerTest, WorkersRegisterAndServersAnswerHealthAndReflection) {
  auto coordinator = CoordinatorServer::Start(
      {.listen = "127.0.0.1:0", .state_dir = StateDir("coordinator")});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int port = (*coordinator)->port();
  auto worker_a = StartWorker("host-a", port);
  auto worker_b = StartWorker("host-b", port);
  ASSERT_TRUE(worker_a && worker_b);

  ASSERT_TRUE(WaitForWorkers(port, [](const v1::ListWorkersResponse& w) {
    return CountInState(w, v1::WORKER_STATE_ALIVE) == 2;
  }));
  const v1::ListWorkersResponse workers = ListWorkers(port);
  EXPECT_EQ(workers.workers(0).registration().host(), "host-a");
  EXPECT_EQ(workers.workers(0).registration().address(),
            "127.0.0.1:" + std::to_string(worker_a->port()));
  EXPECT_EQ(workers.workers(0).registration().incarnation(), worker_a->incarnation());
  EXPECT_EQ(workers.workers(1).registration().host(), "host-b");

  for (int server_port : {port, worker_a->port()}) {
    auto channel = MakeChannel("127.0.0.1:" + std::to_string(server_port));
    EXPECT_EQ(CheckHealth(channel, "", kTimeout).value(), "SERVING");
    auto services = ListServicesByReflection(channel, kTimeout);
    ASSERT_TRUE(services.ok()) << services.status();
    const std::string expected =
        server_port == port ? "meshrun.v1.Coordinator" : "meshrun.v1.Worker";
    EXPECT_NE(std::find(services->begin(), services->end(), expected), services->end());
    EXPECT_NE(std::find(services->begin(), services->end(), "grpc.health.v1.Health"),
              services->end());
  }

  // A drained worker leaves on purpose and is shown as LEFT, not DEAD.
  worker_b->Drain(absl::Seconds(1));
  ASSERT_TRUE(WaitForWorkers(port, [](const v1::ListWorkersResponse& w) {
    return CountInState(w, v1::WORKER_STATE_LEFT) == 1;
  }));
  EXPECT_EQ(CheckHealth(MakeChannel("127.0.0.1:" + std::to_string(worker_b->port())), "",
                        absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST(ClientServerTest, SilentWorkerIsDeclaredDeadWithinTheTimeout) {
  auto coordinator = CoordinatorServer::Start({.listen = "127.0.0.1:0",
                                               .state_dir = StateDir("coordinator-timeout"),
                                               .heartbeat_timeout = absl::Milliseconds(400)});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int port = (*coordinator)->port();
  auto worker = StartWorker("host-silent", port);
  ASSERT_TRUE(WaitForWorkers(port, [](const v1::ListWorkersResponse& w) {
    return CountInState(w, v1::WORKER_STATE_ALIVE) == 1;
  }));
  // Alive across several timeouts while heartbeating.
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  EXPECT_EQ(CountInState(ListWorkers(port), v1::WORKER_STATE_ALIVE), 1);

  // Stop the process's server without deregistering: heartbeats cease.
  auto stub = v1::Coordinator::NewStub(MakeChannel("127.0.0.1:" + std::to_string(port)));
  worker.reset();  // the destructor drains, which deregisters; re-register a silent one instead
  v1::RegisterWorkerRequest request;
  request.mutable_registration()->mutable_protocol()->set_version(1);
  request.mutable_registration()->set_host("host-silent");
  request.mutable_registration()->set_address("127.0.0.1:1");
  request.mutable_registration()->set_incarnation("silent-2");
  v1::RegisterWorkerResponse response;
  auto context = ContextWithTimeout(kTimeout);
  ASSERT_TRUE(stub->RegisterWorker(context.get(), request, &response).ok());
  // Silent from its registration on (the drain above is not part of the timeout).
  const absl::Time killed = absl::Now();
  EXPECT_EQ(response.heartbeat_interval_millis(), 200);
  ASSERT_TRUE(WaitForWorkers(port, [](const v1::ListWorkersResponse& w) {
    return CountInState(w, v1::WORKER_STATE_DEAD) == 1;
  }, absl::Seconds(2)));
  EXPECT_LT(absl::Now() - killed, absl::Milliseconds(800)) << "dead within 2T";
  EXPECT_NE(ListWorkers(port).workers(0).state_reason().find("no heartbeat"), std::string::npos);
}

TEST(ClientServerTest, BadRegistrationsAreRefusedAndChangeNothing) {
  auto coordinator = CoordinatorServer::Start(
      {.listen = "127.0.0.1:0", .state_dir = StateDir("coordinator-bad")});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  auto stub = v1::Coordinator::NewStub(
      MakeChannel("127.0.0.1:" + std::to_string((*coordinator)->port())));

  v1::RegisterWorkerRequest request;
  v1::RegisterWorkerResponse response;
  request.mutable_registration()->mutable_protocol()->set_version(99);
  request.mutable_registration()->set_host("h");
  request.mutable_registration()->set_address("h:1");
  request.mutable_registration()->set_incarnation("i");
  auto context = ContextWithTimeout(kTimeout);
  grpc::Status status = stub->RegisterWorker(context.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(status.error_message().find("versions 1 to 1"), std::string::npos);

  request.mutable_registration()->mutable_protocol()->set_version(1);
  request.mutable_registration()->clear_address();
  context = ContextWithTimeout(kTimeout);
  status = stub->RegisterWorker(context.get(), request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("registration.address"), std::string::npos);
  EXPECT_EQ(ListWorkers((*coordinator)->port()).workers_size(), 0);
}

}  // namespace
}  // namespace meshrun::services

namespace meshrun::services {
namespace {

TEST(ClientServerTest, KeyValueRendezvousOverRpc) {
  auto coordinator = CoordinatorServer::Start(
      {.listen = "127.0.0.1:0", .state_dir = StateDir("coordinator-kv")});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const std::string address = "127.0.0.1:" + std::to_string((*coordinator)->port());
  CoordinatorKeyValueClient host0(MakeChannel(address));
  CoordinatorKeyValueClient host1(MakeChannel(address));

  // A blocking get on one host is answered by a set on the other.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_TRUE(host1.Set("pjrt/topology/1", "ici 2x4").ok());
  });
  EXPECT_EQ(host0.Get("pjrt/topology/1", absl::Seconds(5)).value(), "ici 2x4");
  setter.join();
  EXPECT_EQ(host0.TryGet("pjrt/topology/1").value(), "ici 2x4");
  EXPECT_EQ(host0.TryGet("pjrt/none").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(host0.Get("pjrt/none", absl::Milliseconds(100)).status().code(),
            absl::StatusCode::kDeadlineExceeded);

  // A barrier that one task never reaches names it.
  auto stub = v1::Coordinator::NewStub(MakeChannel(address));
  v1::WaitAtBarrierRequest barrier;
  barrier.set_barrier_id("init");
  barrier.set_task("worker-0");
  barrier.add_tasks("worker-0");
  barrier.add_tasks("worker-1");
  barrier.set_timeout_millis(100);
  v1::WaitAtBarrierResponse response;
  auto context = ContextWithTimeout(kTimeout);
  grpc::Status status = stub->WaitAtBarrier(context.get(), barrier, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_NE(status.error_message().find("worker-1"), std::string::npos);

  // A draining coordinator ends a pending wait cleanly instead of hanging its shutdown.
  std::thread waiter([&] {
    EXPECT_FALSE(host0.Get("pjrt/never", absl::Seconds(60)).ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const absl::Time drain_start = absl::Now();
  (*coordinator)->Drain(absl::Seconds(5));
  EXPECT_LT(absl::Now() - drain_start, absl::Seconds(5));
  waiter.join();
}

}  // namespace
}  // namespace meshrun::services
