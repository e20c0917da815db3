// security, round two (issue 27): attacks by callers the access policy lets in, each replayed
// against a real coordinator with mutual TLS on loopback (certificates made at test time):
//   item 1  a worker registering at another live worker's address;
//   item 2  a submit identity's compile options carrying XLA debug options (xla_dump_to);
//   item 3  a view identity filling the slow-call pool;
//   item 5  a view identity opening every watch stream;
//   item 7  a flood of unauthenticated refusals filling the log;
//   item 11 a certificate of another cluster signed by the same CA.
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/protocol.h"
#include "common/sha256.h"
#include "coordinator_service/coordinator_server.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "rpc/cert_authority.h"
#include "rpc/refusal_log.h"
#include "rpc/server_support.h"
#include "rpc/tls_credentials.h"
#include "testing/black_hole.h"
#include "testing/scratch_dir.h"

namespace meshrun::services {
namespace {

namespace fs = std::filesystem;

std::string Dir() {
  static const std::string dir = testing::FreshScratchDir("security_fairness_test");
  return dir;
}

// Counts the log lines that contain a text.
class LineCounter : public spdlog::sinks::base_sink<std::mutex> {
 public:
  explicit LineCounter(std::string needle) : needle_(std::move(needle)) {}
  int count() {
    std::lock_guard<std::mutex> lock(mutex_);
    return count_;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (absl::StrContains(absl::string_view(msg.payload.data(), msg.payload.size()), needle_)) {
      ++count_;
    }
  }
  void flush_() override {}

 private:
  const std::string needle_;
  int count_ = 0;
};

class SecurityFairnessTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ca_ = Dir() + "/ca";
    ASSERT_TRUE(CreateClusterCa(ca_, "prod", 30).ok());
    for (const auto& [role, name] : std::vector<std::pair<std::string, std::string>>{
             {"coordinator", "coord"}, {"worker", "worker-a"}, {"worker", "worker-b"},
             {"admin", "alice"}, {"view", "vic"}, {"view", "val"}}) {
      ASSERT_TRUE(IssueCertificate({.ca_dir = ca_, .role = role, .name = name, .days = 30}).ok());
    }
    // The same CA, another cluster's name: what two clusters sharing a CA would issue.
    staging_ = Dir() + "/staging-ca";
    fs::create_directories(staging_);
    for (const char* file : {"ca.pem", "ca.key"}) fs::copy_file(ca_ + "/" + file, staging_ + "/" + file);
    std::ofstream(staging_ + "/cluster") << "staging\n";
    ASSERT_TRUE(IssueCertificate({.ca_dir = staging_, .role = "admin", .name = "eve", .days = 30}).ok());

    tokens_ = Dir() + "/tokens";
    std::ofstream(tokens_) << Sha256Hex("view-token") << " view view-bot\n";
    SecurityConfig server = Cert(ca_, "coord");
    server.auth_tokens_file = tokens_;
    SetProcessSecurity(server);
    CoordinatorServer::Config config{.listen = "127.0.0.1:0", .state_dir = Dir() + "/state"};
    config.limits.max_slow_calls = 8;  // view callers: 4 together, 2 each
    config.limits.max_slow_calls_per_identity = 2;
    config.limits.max_watch_streams = 8;
    config.limits.max_watch_streams_per_identity = 3;
    auto coordinator = CoordinatorServer::Start(config);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = coordinator->release();
    v1::JobSpec spec;  // a job whose telemetry is watchable
    v1::TelemetryDeclaration* loss = spec.add_telemetry();
    loss->set_name("loss");
    loss->set_combine(v1::COMBINE_MEAN);
    ASSERT_TRUE(coordinator_->telemetry().DeclareJob("job-1", spec).ok());
  }
  static void TearDownTestSuite() {
    if (coordinator_ != nullptr) coordinator_->Drain(absl::Seconds(1));
    delete coordinator_;
    coordinator_ = nullptr;
    SetProcessSecurity({});
  }

  static SecurityConfig Cert(const std::string& ca, const std::string& name) {
    return {.tls_cert = ca + "/" + name + ".pem", .tls_key = ca + "/" + name + ".key",
            .tls_ca = ca_ + "/ca.pem", .tls_refresh_seconds = 1};
  }
  static SecurityConfig Token(const std::string& token) {
    return {.tls_ca = ca_ + "/ca.pem", .token = token};
  }
  static std::unique_ptr<v1::Coordinator::Stub> Stub(const SecurityConfig& caller) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    return v1::Coordinator::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", coordinator_->port()), MakeChannelCredentials(caller), args));
  }
  // Registers `host`, with its own certificate, at `address` as run `incarnation`.
  static grpc::Status Register(const std::string& host, const std::string& address,
                               const std::string& incarnation) {
    v1::RegisterWorkerRequest request;
    request.mutable_registration()->set_host(host);
    request.mutable_registration()->set_address(address);
    request.mutable_registration()->set_incarnation(incarnation);
    request.mutable_registration()->mutable_protocol()->set_version(kProtocolVersion);
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    return Stub(Cert(ca_, host))->RegisterWorker(&context, request, &response);
  }
  // Ends a test's registration. The tests share one coordinator, where a host left registered
  // stays alive, its name and address taken, until its heartbeat timeout: a later test
  // registering the same host would be refused as a second worker of that name.
  static void Deregister(const std::string& host, const std::string& incarnation) {
    v1::DeregisterWorkerRequest request;
    request.set_host(host);
    request.set_incarnation(incarnation);
    v1::DeregisterWorkerResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(5)));
    const grpc::Status left = Stub(Cert(ca_, host))->DeregisterWorker(&context, request, &response);
    EXPECT_TRUE(left.ok()) << left.error_message();
  }

  static inline std::string ca_, staging_, tokens_;
  static inline CoordinatorServer* coordinator_ = nullptr;
};

// Item 1: worker-b, with its own valid certificate, registers at worker-a's address; had it
// been taken, every call the coordinator makes to worker-a would expect worker-b's identity.
TEST_F(SecurityFairnessTest, AWorkerCannotRegisterAtAnotherLiveWorkersAddress) {
  testing::BlackHole port;
  const grpc::Status registered = Register("worker-a", port.address(), "worker-a-1");
  ASSERT_TRUE(registered.ok()) << registered.error_message();
  const grpc::Status taken = Register("worker-b", port.address(), "worker-b-1");
  EXPECT_EQ(taken.error_code(), grpc::StatusCode::ALREADY_EXISTS) << taken.error_message();
  EXPECT_TRUE(absl::StrContains(taken.error_message(), "belongs to host worker-a"))
      << taken.error_message();
  EXPECT_TRUE(absl::StrContains(taken.error_message(), "worker-b")) << taken.error_message();
  Deregister("worker-a", "worker-a-1");
}

// Item 2: compile options naming a dump directory are refused at submit, naming the field;
// nothing is written there.
TEST_F(SecurityFairnessTest, CompileOptionsWithDebugOptionsAreRefusedAtSubmit) {
  const std::string dump = Dir() + "/dump";
  auto field = [](int number, const std::string& payload) {
    return std::string(1, static_cast<char>(number << 3 | 2)) +
           std::string(1, static_cast<char>(payload.size())) + payload;
  };
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_name("dump");
  v1::Program* program = request.mutable_spec()->add_programs();
  program->set_role("step");
  program->set_stablehlo("module {}");
  // executable_build_options { debug_options { xla_dump_to: <dump> } }
  program->set_compile_options(field(3, field(3, field(8, dump))));
  v1::SubmitJobResponse response;
  grpc::ClientContext context;
  const grpc::Status refused = Stub(Cert(ca_, "alice"))->SubmitJob(&context, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(),
                                "programs[0].compile_options sets "
                                "executable_build_options.debug_options"))
      << refused.error_message();
  EXPECT_FALSE(fs::exists(dump));
}

// Item 11: an admin certificate of cluster "staging", signed by the CA "prod" shares, is no one
// here.
TEST_F(SecurityFairnessTest, ACertificateOfAnotherClusterIsNoOne) {
  v1::ListJobsRequest request;
  v1::ListJobsResponse response;
  grpc::ClientContext context;
  const grpc::Status refused =
      Stub(Cert(staging_, "eve"))->ListJobs(&context, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAUTHENTICATED) << refused.error_message();
  EXPECT_TRUE(absl::StrContains(refused.error_message(), "is for cluster \"staging\"; this is "
                                                         "cluster \"prod\""))
      << refused.error_message();
  grpc::ClientContext own;
  EXPECT_TRUE(Stub(Cert(ca_, "alice"))->ListJobs(&own, request, &response).ok());
}

// Item 3: view callers keep slow calls in flight (each waits on a worker that never answers);
// one identity gets its share, view callers together half the pool, and an admin's slow call
// is still taken.
TEST_F(SecurityFairnessTest, ViewCallersCannotTakeEverySlowCall) {
  testing::BlackHole port;
  const grpc::Status registered = Register("worker-b", port.address(), "worker-b-2");
  ASSERT_TRUE(registered.ok()) << registered.error_message();
  auto metrics = [](const SecurityConfig& caller) {
    return std::async(std::launch::async, [caller] {
      v1::GetMetricsRequest request;
      request.set_host("worker-b");
      v1::GetMetricsResponse response;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(4)));
      return Stub(caller)->GetMetrics(&context, request, &response);
    });
  };
  std::vector<std::future<grpc::Status>> token_calls, vic_calls, val_calls;
  for (int i = 0; i < 5; ++i) token_calls.push_back(metrics(Token("view-token")));
  absl::SleepFor(absl::Milliseconds(500));  // the share is taken before the next caller
  for (int i = 0; i < 2; ++i) vic_calls.push_back(metrics(Cert(ca_, "vic")));
  absl::SleepFor(absl::Milliseconds(500));
  val_calls.push_back(metrics(Cert(ca_, "val")));
  std::future<grpc::Status> admin = metrics(Cert(ca_, "alice"));
  int refused = 0;
  for (auto& call : token_calls) {
    const grpc::Status status = call.get();
    if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      ++refused;
      // Its share, or (when the other view callers came first) the view pool: either way
      // not the admins' and workers' slots.
      EXPECT_TRUE(absl::StrContains(status.error_message(), "of view/view-bot are open, the "
                                                             "limit per identity") ||
                  absl::StrContains(status.error_message(), "(view callers) are open"))
          << status.error_message();
    }
  }
  EXPECT_EQ(refused, 3) << "one identity holds its share of 2";
  for (auto& call : vic_calls) {
    EXPECT_NE(call.get().error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  const grpc::Status val = val_calls[0].get();
  EXPECT_EQ(val.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << "view pool of 4 is full";
  EXPECT_TRUE(absl::StrContains(val.error_message(), "(view callers) are open, the limit in all"))
      << val.error_message();
  const grpc::Status taken = admin.get();
  EXPECT_NE(taken.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << taken.error_message();
  Deregister("worker-b", "worker-b-2");
}

// Item 5: a view identity opening many watch streams gets its share; an admin still watches.
TEST_F(SecurityFairnessTest, OneViewIdentityCannotTakeEveryWatchStream) {
  auto view = Stub(Token("view-token"));
  v1::WatchTelemetryRequest request;
  request.set_job_id("job-1");
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientReader<v1::GlobalSummary>>> held;
  for (int i = 0; i < 3; ++i) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    held.push_back(view->WatchTelemetry(contexts.back().get(), request));
  }
  auto watch = [&](v1::Coordinator::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(800)));
    auto reader = stub.WatchTelemetry(&context, request);
    v1::GlobalSummary summary;
    while (reader->Read(&summary)) {
    }
    return reader->Finish();
  };
  // The server counts the held streams a hop after the client opened them.
  grpc::Status fourth = watch(*view);
  for (int i = 0; i < 50 && fourth.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED; ++i) {
    fourth = watch(*view);
  }
  EXPECT_EQ(fourth.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << fourth.error_message();
  EXPECT_TRUE(absl::StrContains(fourth.error_message(), "--max_watch_streams_per_identity"))
      << fourth.error_message();
  auto admin = Stub(Cert(ca_, "alice"));
  EXPECT_EQ(watch(*admin).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
      << "the admin's watch stays open";
  for (auto& context : contexts) context->TryCancel();
  for (auto& reader : held) reader->Finish();
}

// Item 7: a flood of unauthenticated calls is refused, counted per caller and reason, and
// logged a few times, not once per call.
TEST_F(SecurityFairnessTest, RefusalsAreCountedAndLoggedAtABoundedRate) {
  auto counter = std::make_shared<LineCounter>("refused /meshrun.v1.Coordinator/ListJobs");
  spdlog::default_logger()->sinks().push_back(counter);
  auto anonymous = Stub(SecurityConfig{.tls_ca = ca_ + "/ca.pem"});
  const auto before = RefusalLog::Process().Counts();
  const std::pair<std::string, std::string> key{"unauthenticated", "unauthenticated ListJobs"};
  const int64_t counted_before = before.contains(key) ? before.at(key) : 0;
  constexpr int kCalls = 500;
  for (int i = 0; i < kCalls; ++i) {
    v1::ListJobsResponse response;
    grpc::ClientContext context;
    ASSERT_EQ(anonymous->ListJobs(&context, v1::ListJobsRequest(), &response).error_code(),
              grpc::StatusCode::UNAUTHENTICATED);
  }
  spdlog::default_logger()->sinks().pop_back();
  EXPECT_EQ(RefusalLog::Process().Counts().at(key) - counted_before, kCalls);
  EXPECT_GE(counter->count(), counted_before == 0 ? 1 : 0);
  EXPECT_LE(counter->count(), 2) << "one line per caller and reason per 10 s";
}

}  // namespace
}  // namespace meshrun::services
