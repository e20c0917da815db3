// Telemetry relays over loopback (docs/scale.md, "Telemetry relays"): a real CoordinatorServer,
// the worker's TelemetryRelay behind a Worker server as a relay host "h0" serves it, and the
// group's hosts "h0".."h3" uploading through it with the worker's own TelemetryUploader. The
// job is started on the coordinator's telemetry directly; everything else goes through the
// RPCs. Plaintext: who may relay for whom under TLS is security_test's.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator_service/coordinator_server.h"
#include "testing/scratch_dir.h"
#include "worker_service/telemetry_relay.h"
#include "worker_service/telemetry_uploader.h"

namespace meshrun::services {
namespace {

constexpr char kJob[] = "relay-1";
const std::vector<std::string> kMembers = {"h0", "h1", "h2", "h3"};  // h0 relays

// A Worker server that serves RelayTelemetry through a TelemetryRelay, as WorkerServer does.
class RelayHost {
 public:
  explicit RelayHost(const std::string& coordinator)
      : relay_(std::make_unique<TelemetryRelay>(TelemetryRelay::Config{
            .coordinator = grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials())})),
        service_(relay_.get()) {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
  }
  ~RelayHost() { Kill(); }
  // Stops at once, as the relay's process dying would: its members' streams end.
  void Kill() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());
    server_.reset();
    relay_.reset();
  }
  bool serving() const { return server_ != nullptr && port_ > 0; }
  std::string address() const { return absl::StrCat("127.0.0.1:", port_); }
  TelemetryRelay::Figures figures() const { return relay_->figures(); }
  void Stop() { relay_->Stop(); }

 private:
  struct Service : v1::Worker::CallbackService {
    explicit Service(TelemetryRelay* relay) : relay(relay) {}
    grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck>* RelayTelemetry(
        grpc::CallbackServerContext* context) override {
      return relay->Serve(context);
    }
    TelemetryRelay* relay;
  };
  std::unique_ptr<TelemetryRelay> relay_;
  Service service_;
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

v1::HostSummary Loss(const std::string& host, int64_t step, const std::string& series = "loss") {
  v1::HostSummary summary;
  summary.set_job_id(kJob);
  summary.set_host(host);
  summary.set_step(step);
  summary.set_replica_count(1);
  v1::TelemetryValue* value = summary.add_values();
  value->set_name(series);
  value->add_values(1.0f / static_cast<float>(step));
  return summary;
}

class TelemetryRelayTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = CoordinatorServer::Start(
        {.listen = "127.0.0.1:0", .state_dir = testing::FreshScratchDir("telemetry_relay_test"),
         .pjrt_plugin = ""});
    ASSERT_TRUE(server.ok()) << server.status();
    coordinator_ = std::move(*server);
    address_ = absl::StrCat("127.0.0.1:", coordinator_->port());
    v1::JobManifest job;
    job.set_job_id(kJob);
    v1::TelemetryDeclaration* loss = job.mutable_spec()->add_telemetry();
    loss->set_name("loss");
    loss->set_combine(v1::COMBINE_MEAN);
    job.mutable_mesh()->add_shape(4);
    for (const char* host : {"h0", "h1", "h2", "h3"}) {
      (*job.mutable_host_incarnations())[host] = absl::StrCat("inc-", host);
    }
    ASSERT_TRUE(coordinator_->telemetry().DeclareJob(kJob, job.spec()).ok());
    ASSERT_TRUE(coordinator_->telemetry().StartJob(job).ok());
    relay_ = std::make_unique<RelayHost>(address_);
    ASSERT_TRUE(relay_->serving());
    for (size_t m = 0; m < kMembers.size(); ++m) {
      members_.push_back(Uploader());
      members_.back()->UseRelay("h0", relay_->address());
    }
  }
  void TearDown() override {
    members_.clear();
    relay_.reset();
    if (coordinator_ != nullptr) coordinator_->Drain(absl::Seconds(1));
  }

  std::unique_ptr<TelemetryUploader> Uploader() {
    return std::make_unique<TelemetryUploader>(TelemetryUploader::Config{
        .coordinator = address_, .credentials = grpc::InsecureChannelCredentials()});
  }
  // Every host's summary of steps [first, last]; true once all are acknowledged.
  bool SendSteps(int64_t first, int64_t last) {
    for (int64_t step = first; step <= last; ++step) {
      for (size_t m = 0; m < members_.size(); ++m) members_[m]->Enqueue(Loss(kMembers[m], step));
    }
    bool acknowledged = true;
    for (auto& member : members_) {
      acknowledged = member->Flush(kJob, absl::Seconds(20)) && acknowledged;
    }
    return acknowledged;
  }
  // Steps 1.. in the history: each must be whole (every host's summary, none partial).
  void ExpectWholeSteps(int64_t steps) {
    auto history = coordinator_->telemetry().history().Read(
        {.job_id = kJob, .since_step = 1, .host_detail = true});
    ASSERT_TRUE(history.ok()) << history.status();
    ASSERT_EQ(history->size(), static_cast<size_t>(steps));
    for (int64_t step = 1; step <= steps; ++step) {
      const v1::GlobalSummary& global = (*history)[step - 1];
      EXPECT_EQ(global.step(), step);
      EXPECT_FALSE(global.partial()) << "step " << step;
      EXPECT_EQ(global.host_detail_size(), 4) << "step " << step;
    }
  }

  std::unique_ptr<CoordinatorServer> coordinator_;
  std::string address_;
  std::unique_ptr<RelayHost> relay_;
  std::vector<std::unique_ptr<TelemetryUploader>> members_;  // kMembers' uploaders
};

TEST_F(TelemetryRelayTest, MembersSummariesTravelInBatchesAndAreAcknowledgedAfterTheCommit) {
  ASSERT_TRUE(SendSteps(1, 30)) << "summaries not acknowledged";
  ExpectWholeSteps(30);
  const TelemetryRelay::Figures figures = relay_->figures();
  EXPECT_EQ(figures.summaries, 120);  // each summary once: none went around the relay
  EXPECT_GE(figures.batches, 1);
  EXPECT_LE(figures.batches, figures.summaries);
  for (auto& member : members_) EXPECT_EQ(member->dropped(), 0);
}

TEST_F(TelemetryRelayTest, MembersUploadThemselvesOnceTheRelayIsGone) {
  ASSERT_TRUE(SendSteps(1, 10));
  EXPECT_EQ(relay_->figures().summaries, 40);
  relay_->Kill();
  // Nothing acknowledged is lost, and the rest of the job reaches the coordinator directly.
  ASSERT_TRUE(SendSteps(11, 20)) << "members did not fall back to the coordinator";
  ExpectWholeSteps(20);
  for (auto& member : members_) EXPECT_EQ(member->dropped(), 0);
}

TEST_F(TelemetryRelayTest, ADrainingRelaySendsItsMembersToTheCoordinator) {
  ASSERT_TRUE(SendSteps(1, 5));
  relay_->Stop();  // what a relay host's drain does before its server stops
  ASSERT_TRUE(SendSteps(6, 10)) << "members did not fall back to the coordinator";
  ExpectWholeSteps(10);
  EXPECT_EQ(relay_->figures().summaries, 20);  // steps 6..10 went around the relay
}

TEST_F(TelemetryRelayTest, ARefusalEndsOnlyThatHostsStream) {
  // h1's summary names a series the job does not declare: the coordinator refuses it, and the
  // relay ends h1's stream with that refusal; h1 drops that summary and uploads on.
  TelemetryUploader& h1 = *members_[1];
  h1.Enqueue(Loss("h1", 1, "bogus"));
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (h1.dropped() == 0 && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(10));
  ASSERT_EQ(h1.dropped(), 1) << "the refusal did not reach h1";
  ASSERT_TRUE(SendSteps(1, 5));
  ExpectWholeSteps(5);
  for (size_t m : {0, 2, 3}) EXPECT_EQ(members_[m]->dropped(), 0) << kMembers[m];
  // Every summary went through the relay: a refusal is no reason to go around it.
  EXPECT_EQ(relay_->figures().summaries, 1 + 20);
}

}  // namespace
}  // namespace meshrun::services
