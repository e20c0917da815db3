// The coordinator's calls for large fleets, on a real coordinator over loopback gRPC:
// StreamHeartbeats (a beat acknowledged, refusals ending the stream, a real worker fenced on its
// stream registering afresh at once) and ListWorkers' paging and filters.
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <thread>
#include <vector>

#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "coordinator_service/coordinator_server.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "rpc/server_support.h"
#include "worker_service/worker_server.h"

namespace meshrun::services {
namespace {

std::string StateDir(const std::string& name) {
  return ::testing::TempDir() + "/worker_fleet_rpc_test/" + name;
}

class WorkerFleetRpcTest : public ::testing::Test {
 protected:
  void Start(absl::Duration heartbeat_timeout) {
    auto coordinator = CoordinatorServer::Start(
        {.listen = "127.0.0.1:0",
         .state_dir = StateDir(::testing::UnitTest::GetInstance()->current_test_info()->name()),
         .heartbeat_timeout = heartbeat_timeout});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = std::move(*coordinator);
    stub_ = v1::Coordinator::NewStub(MakeChannel(Address()));
  }
  std::string Address() const { return absl::StrCat("127.0.0.1:", coordinator_->port()); }
  grpc::Status Register(const std::string& host, const std::string& incarnation, int slice = 0,
                        const std::string& address = "") {
    v1::RegisterWorkerRequest request;
    v1::WorkerRegistration& r = *request.mutable_registration();
    r.mutable_protocol()->set_version(1);
    r.set_host(host);
    r.set_address(address.empty() ? absl::StrCat("127.0.0.1:", 10 + registered_++) : address);
    r.set_incarnation(incarnation);
    r.set_slice_id(slice);
    r.add_devices()->set_global_id(0);
    v1::RegisterWorkerResponse response;
    auto context = ContextWithTimeout(absl::Seconds(5));
    return stub_->RegisterWorker(context.get(), request, &response);
  }
  v1::ListWorkersResponse List(const v1::ListWorkersRequest& request, grpc::Status* status) {
    v1::ListWorkersResponse response;
    auto context = ContextWithTimeout(absl::Seconds(5));
    *status = stub_->ListWorkers(context.get(), request, &response);
    return response;
  }
  static std::string Hosts(const v1::ListWorkersResponse& response) {
    std::vector<std::string> hosts;
    for (const v1::WorkerStatus& w : response.workers()) hosts.push_back(w.registration().host());
    return absl::StrJoin(hosts, " ");
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  int registered_ = 0;
};

v1::HeartbeatRequest Beat(const std::string& host, const std::string& incarnation,
                          bool ack = true) {
  v1::HeartbeatRequest beat;
  beat.set_host(host);
  beat.set_incarnation(incarnation);
  beat.set_ack(ack);
  return beat;
}

TEST_F(WorkerFleetRpcTest, StreamKeepsAHostAliveAndEndsWithTheFirstRefusal) {
  Start(absl::Milliseconds(400));
  ASSERT_TRUE(Register("host-a", "inc-a").ok());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub_->StreamHeartbeats(&context);
  // Beats every 100 ms across three timeouts, each acknowledged: the host stays ALIVE.
  for (int i = 0; i < 12; ++i) {
    ASSERT_TRUE(stream->Write(Beat("host-a", "inc-a")));
    v1::HeartbeatResponse ack;
    ASSERT_TRUE(stream->Read(&ack)) << "beat " << i << " was not acknowledged";
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  // A worker's beats ask for no ack and keep the host alive as well, across two timeouts, with
  // no answer: the next ack read is the timed beat's after them, and once the refused beat
  // below ends the stream no read finds one left.
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(stream->Write(Beat("host-a", "inc-a", /*ack=*/false)));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(stream->Write(Beat("host-a", "inc-a")));
  {
    v1::HeartbeatResponse ack;
    ASSERT_TRUE(stream->Read(&ack)) << "the timed beat was not acknowledged";
  }
  grpc::Status status;
  v1::ListWorkersResponse listed = List({}, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(listed.workers_size(), 1);
  EXPECT_EQ(listed.workers(0).state(), v1::WORKER_STATE_ALIVE);
  // A beat of another incarnation ends the stream, naming both.
  ASSERT_TRUE(stream->Write(Beat("host-a", "inc-other")));
  v1::HeartbeatResponse ack;
  EXPECT_FALSE(stream->Read(&ack));
  status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "inc-a")) << status.error_message();
  EXPECT_TRUE(absl::StrContains(status.error_message(), "inc-other")) << status.error_message();

  // An unknown host: NOT_FOUND, register first. A replaced incarnation: FAILED_PRECONDITION.
  ASSERT_TRUE(Register("host-a", "inc-a2", 0, listed.workers(0).registration().address()).ok());
  for (const auto& [beat, code] :
       std::vector<std::pair<v1::HeartbeatRequest, grpc::StatusCode>>{
           {Beat("host-404", "inc"), grpc::StatusCode::NOT_FOUND},
           {Beat("host-a", "inc-a"), grpc::StatusCode::FAILED_PRECONDITION}}) {
    grpc::ClientContext refused_context;
    refused_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    auto refused = stub_->StreamHeartbeats(&refused_context);
    ASSERT_TRUE(refused->Write(beat));
    EXPECT_FALSE(refused->Read(&ack));
    const grpc::Status ended = refused->Finish();
    EXPECT_EQ(ended.error_code(), code) << beat.host() << ": " << ended.error_message();
  }
}

TEST_F(WorkerFleetRpcTest, WorkerFencedOnItsStreamRegistersAFreshIncarnationAtOnce) {
  Start(absl::Seconds(4));  // beats every 2 s
  auto worker = WorkerServer::Start({.listen = "127.0.0.1:0",
                                     .advertise_address = "",
                                     .coordinator = Address(),
                                     .identity = {.host = "host-w"},
                                     .state_dir = StateDir("host-w")});
  ASSERT_TRUE(worker.ok()) << worker.status();
  grpc::Status status;
  v1::ListWorkersResponse listed;
  for (int i = 0; i < 100 && listed.workers_size() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    listed = List({}, &status);
  }
  ASSERT_EQ(listed.workers_size(), 1);
  const std::string first = listed.workers(0).registration().incarnation();
  // Right after a beat (so the next is 2 s away), another incarnation of the host takes its
  // place: the worker's next beat is refused on its stream, and it registers a fresh
  // incarnation at once, ~2 s from now, where waiting out an interval would take ~4 s.
  const int64_t registered_beat = listed.workers(0).last_heartbeat_unix_micros();
  for (int i = 0; i < 400 && listed.workers(0).last_heartbeat_unix_micros() == registered_beat;
       ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    listed = List({}, &status);
  }
  ASSERT_NE(listed.workers(0).last_heartbeat_unix_micros(), registered_beat) << "no beat in 4 s";
  ASSERT_TRUE(Register("host-w", "impostor", 0, listed.workers(0).registration().address()).ok());
  const absl::Time fenced = absl::Now();
  std::string now;
  while (absl::Now() - fenced < absl::Seconds(10)) {
    listed = List({}, &status);
    now = listed.workers(0).registration().incarnation();
    if (now != "impostor" && now != first) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_NE(now, "impostor");
  EXPECT_NE(now, first);
  EXPECT_EQ(listed.workers(0).state(), v1::WORKER_STATE_ALIVE);
  EXPECT_LT(absl::Now() - fenced, absl::Seconds(3)) << "the refusal waited for the next interval";
  EXPECT_EQ((*worker)->incarnation(), now);
}

TEST_F(WorkerFleetRpcTest, ListWorkersPagesAndFilters) {
  Start(absl::Seconds(60));
  // host-10 sorts after host-2 (natural order); slices 0, 0, 0, 1, 1.
  const std::vector<std::pair<std::string, int>> hosts = {
      {"host-1", 0}, {"host-2", 0}, {"host-10", 0}, {"host-3", 1}, {"host-4", 1}};
  for (const auto& [host, slice] : hosts) ASSERT_TRUE(Register(host, "inc-" + host, slice).ok());

  grpc::Status status;
  v1::ListWorkersRequest request;
  request.set_page_size(2);
  std::vector<std::string> pages;
  for (int i = 0; i < 5; ++i) {
    const v1::ListWorkersResponse page = List(request, &status);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_EQ(page.total_matches(), 5);
    ASSERT_EQ(page.slices_size(), 2);
    EXPECT_EQ(page.slices(0).alive(), 3);
    EXPECT_EQ(page.slices(0).alive_devices(), 3);
    EXPECT_EQ(page.slices(1).alive(), 2);
    pages.push_back(Hosts(page));
    if (page.next_page_token().empty()) break;
    request.set_page_token(page.next_page_token());
  }
  EXPECT_EQ(pages, (std::vector<std::string>{"host-1 host-2", "host-10 host-3", "host-4"}));

  v1::ListWorkersRequest slice;
  slice.set_slice_id(1);
  EXPECT_EQ(Hosts(List(slice, &status)), "host-3 host-4");
  v1::ListWorkersRequest dead;
  dead.set_state(v1::WORKER_STATE_DEAD);
  const v1::ListWorkersResponse none = List(dead, &status);
  EXPECT_EQ(none.workers_size(), 0);
  EXPECT_EQ(none.total_matches(), 0);

  // The hosts a job's mesh places it on.
  v1::JobSpec spec;
  spec.set_name("placed");
  const std::string job = coordinator_->jobs().Add(spec);
  ASSERT_TRUE(coordinator_->jobs()
                  .Update(job, [](v1::JobManifest& m) {
                    for (const char* host : {"host-10", "host-10", "host-4"}) {
                      m.mutable_mesh()->add_device_hosts(host);
                    }
                  })
                  .ok());
  v1::ListWorkersRequest on_job;
  on_job.set_on_job_id(job);
  EXPECT_EQ(Hosts(List(on_job, &status)), "host-10 host-4");

  // Refusals name the field.
  v1::ListWorkersRequest bad;
  bad.set_page_token("nonsense");
  List(bad, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "page_token")) << status.error_message();
  bad.Clear();
  bad.set_page_size(-1);
  List(bad, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_TRUE(absl::StrContains(status.error_message(), "page_size")) << status.error_message();
  bad.Clear();
  bad.set_on_job_id("job-404");
  List(bad, &status);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
}

// The coordinator's service lists its methods by hand (coordinator_server.cc): one left out
// would stay a sync method answering UNIMPLEMENTED.
TEST_F(WorkerFleetRpcTest, EveryCoordinatorMethodIsServed) {
  Start(absl::Seconds(10));
  const auto* service = google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
      "meshrun.v1.Coordinator");
  ASSERT_NE(service, nullptr);
  grpc::GenericStub generic(MakeChannel(Address()));
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string method = absl::StrCat("/meshrun.v1.Coordinator/", service->method(i)->name());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
    grpc::Slice empty("");
    grpc::ByteBuffer request(&empty, 1);
    grpc::ByteBuffer response;
    std::promise<grpc::Status> done;
    generic.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                      [&](grpc::Status status) { done.set_value(std::move(status)); });
    const grpc::Status status = done.get_future().get();
    EXPECT_NE(status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
        << method << ": " << status.error_message();
  }
}

}  // namespace
}  // namespace meshrun::services
