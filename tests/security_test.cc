// Access control on real servers over loopback: a coordinator and a worker with mutual TLS and
// a tokens file, certificates made at test time by rpc/cert_authority. Every RPC of both
// services (read from the proto descriptors, so new RPCs are covered) is called with every kind
// of caller, and each cell must get the code this file's own list of roles (ExpectedRoles) says;
// the policy table is checked against that list. Then the identity checks, certificate rotation
// and token revocation.
#include <google/protobuf/descriptor.h>
#include <grpcpp/generic/generic_stub.h>
#include <gtest/gtest.h>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/sha256.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "meshrun/v1/telemetry.pb.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "rpc/cert_authority.h"
#include "rpc/refusal_log.h"
#include "coordinator_service/coordinator_server.h"
#include "rpc/server_support.h"
#include "rpc/tls_credentials.h"
#include "testing/scratch_dir.h"
#include "worker_service/worker_server.h"

namespace meshrun::services {
namespace {

struct Caller {
  std::string label;
  SecurityConfig credentials;              // what the client presents
  std::optional<Identity> identity;        // who the policy should see
  grpc::StatusCode handshake_failure = grpc::StatusCode::OK;  // UNAVAILABLE: no connection
};

std::string Dir() {
  static const std::string dir = testing::FreshScratchDir("security_test");
  return dir;
}

std::string Issue(const std::string& ca, const std::string& role, const std::string& name,
                  int days = 30) {
  auto id = IssueCertificate({.ca_dir = ca, .role = role, .name = name, .days = days});
  EXPECT_TRUE(id.ok()) << id.status();
  return name;
}

SecurityConfig CertCaller(const std::string& ca, const std::string& name,
                          const std::string& trust) {
  return {.tls_cert = ca + "/" + name + ".pem", .tls_key = ca + "/" + name + ".key",
          .tls_ca = trust + "/ca.pem", .tls_refresh_seconds = 1};
}

grpc::Status Call(const SecurityConfig& credentials, int port, const std::string& method,
                  const std::string& payload = "") {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  auto channel = grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                           MakeChannelCredentials(credentials), args);
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
  grpc::Slice slice(payload);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status status) { done.set_value(std::move(status)); });
  return done.get_future().get();
}

std::vector<std::string> Methods(const std::string& service) {
  const auto* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  std::vector<std::string> methods;
  for (int i = 0; i < descriptor->method_count(); ++i) {
    methods.push_back(absl::StrCat("/", service, "/", descriptor->method(i)->name()));
  }
  return methods;
}

// The role each RPC needs, written out here and not read from RequiredRole: this list is the
// matrix's oracle, so a wrong entry in the policy table fails instead of checking itself.
// A new RPC fails PolicyTableMatchesTheWrittenList until it is classified here.
const std::map<std::string, Role>& ExpectedRoles() {
  static const auto* roles = new std::map<std::string, Role>{
      {"/meshrun.v1.Coordinator/RegisterWorker", Role::kWorker},
      {"/meshrun.v1.Coordinator/Heartbeat", Role::kWorker},
      {"/meshrun.v1.Coordinator/StreamHeartbeats", Role::kWorker},
      {"/meshrun.v1.Coordinator/DeregisterWorker", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueSet", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueGet", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueTryGet", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueList", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueDelete", Role::kWorker},
      {"/meshrun.v1.Coordinator/WaitAtBarrier", Role::kWorker},
      {"/meshrun.v1.Coordinator/UploadTelemetry", Role::kWorker},
      {"/meshrun.v1.Coordinator/RelayTelemetry", Role::kWorker},
      {"/meshrun.v1.Coordinator/ReportJobProgress", Role::kWorker},
      {"/meshrun.v1.Coordinator/ReportCheckpoint", Role::kWorker},
      {"/meshrun.v1.Coordinator/PreemptJob", Role::kWorker},
      {"/meshrun.v1.Coordinator/GetSupportedVersions", Role::kAnyAuthenticated},
      {"/meshrun.v1.Coordinator/ListWorkers", Role::kView},
      {"/meshrun.v1.Coordinator/GetJob", Role::kView},
      {"/meshrun.v1.Coordinator/ListJobs", Role::kView},
      {"/meshrun.v1.Coordinator/WatchTelemetry", Role::kView},
      {"/meshrun.v1.Coordinator/WatchTelemetryBatches", Role::kView},
      {"/meshrun.v1.Coordinator/GetMetrics", Role::kView},
      {"/meshrun.v1.Coordinator/GetDeviceMemory", Role::kView},
      {"/meshrun.v1.Coordinator/SubmitJob", Role::kSubmit},
      {"/meshrun.v1.Coordinator/UploadProgram", Role::kSubmit},
      {"/meshrun.v1.Coordinator/CancelJob", Role::kSubmit},
      {"/meshrun.v1.Coordinator/CheckpointJob", Role::kSubmit},
      {"/meshrun.v1.Coordinator/DrainWorker", Role::kAdmin},
      {"/meshrun.v1.Worker/GetSupportedVersions", Role::kCoordinator},
      {"/meshrun.v1.Worker/LoadExecutable", Role::kCoordinator},
      {"/meshrun.v1.Worker/CompileProgram", Role::kCoordinator},
      {"/meshrun.v1.Worker/StartJob", Role::kCoordinator},
      {"/meshrun.v1.Worker/StopJob", Role::kCoordinator},
      {"/meshrun.v1.Worker/GetStatus", Role::kCoordinator},
      {"/meshrun.v1.Worker/GetDeviceMemory", Role::kCoordinator},
      {"/meshrun.v1.Worker/CheckpointNow", Role::kCoordinator},
      {"/meshrun.v1.Worker/Drain", Role::kCoordinator},
      {"/meshrun.v1.Worker/FetchMemoryCheckpoint", Role::kWorker},
      {"/meshrun.v1.Worker/RelayTelemetry", Role::kWorker},
      {"/grpc.health.v1.Health/Check", Role::kAnyAuthenticated},
      {"/grpc.health.v1.Health/Watch", Role::kAnyAuthenticated},
      {"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", Role::kView},
  };
  return *roles;
}

// Which callers hold a needed role, also written out (not Authorize's ranking): admin includes
// submit includes view; worker and coordinator are service identities holding only themselves.
bool Holds(Role caller, Role need) {
  static const auto* holders = new std::map<Role, std::set<Role>>{
      {Role::kView, {Role::kView, Role::kSubmit, Role::kAdmin}},
      {Role::kSubmit, {Role::kSubmit, Role::kAdmin}},
      {Role::kAdmin, {Role::kAdmin}},
      {Role::kWorker, {Role::kWorker}},
      {Role::kCoordinator, {Role::kCoordinator}},
      {Role::kAnyAuthenticated,
       {Role::kView, Role::kSubmit, Role::kAdmin, Role::kWorker, Role::kCoordinator,
        Role::kMetrics}},
  };
  auto it = holders->find(need);
  return it != holders->end() && it->second.count(caller) > 0;
}

// What the servers log while it lives: the default logger is replaced by one writing to the
// old sinks and to this one (the old logger is kept alive: other threads may still hold it).
class LogCapture : public spdlog::sinks::base_sink<std::mutex> {
 public:
  static std::shared_ptr<LogCapture> Install() {
    auto capture = std::make_shared<LogCapture>();
    capture->previous_ = spdlog::default_logger();
    std::vector<spdlog::sink_ptr> sinks = capture->previous_->sinks();
    sinks.push_back(capture);
    auto logger = std::make_shared<spdlog::logger>("capture", sinks.begin(), sinks.end());
    logger->set_level(capture->previous_->level());
    spdlog::set_default_logger(logger);
    return capture;
  }
  void Uninstall() { spdlog::set_default_logger(previous_); }
  // The lines that contain `needle`.
  std::vector<std::string> Lines(const std::string& needle) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::string> lines;
    for (absl::string_view line : absl::StrSplit(text_, '\n')) {
      if (absl::StrContains(line, needle)) lines.emplace_back(line);
    }
    return lines;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    text_.append(msg.payload.data(), msg.payload.size());
    text_ += '\n';
  }
  void flush_() override {}

 private:
  std::shared_ptr<spdlog::logger> previous_;
  std::string text_;
};

bool RefusedByPolicy(const grpc::Status& status) {
  return status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
         absl::StrContains(status.error_message(), "needs role");
}

class SecurityTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ca_ = Dir() + "/ca";
    other_ca_ = Dir() + "/other-ca";
    ASSERT_TRUE(CreateClusterCa(ca_, "test", 30).ok());
    ASSERT_TRUE(CreateClusterCa(other_ca_, "test", 30).ok());
    for (const auto& [role, name] : std::vector<std::pair<std::string, std::string>>{
             {"coordinator", "coord"}, {"worker", "worker-a"}, {"admin", "alice"},
             {"submit", "sam"}, {"view", "vic"}}) {
      Issue(ca_, role, name);
    }
    Issue(ca_, "admin", "expired", -1);
    Issue(other_ca_, "admin", "mallory");
    tokens_file_ = Dir() + "/tokens";
    WriteTokens(/*revocable=*/true);
    SecurityConfig server = CertCaller(ca_, "coord", ca_);
    server.auth_tokens_file = tokens_file_;
    SetProcessSecurity(server);
    auto coordinator = CoordinatorServer::Start(
        {.listen = "127.0.0.1:0", .state_dir = Dir() + "/coordinator-state", .pjrt_plugin = ""});
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = coordinator->release();
    SecurityConfig worker_security = CertCaller(ca_, "worker-a", ca_);  // its own certificate
    worker_security.auth_tokens_file = tokens_file_;
    SetProcessSecurity(worker_security);
    auto worker = WorkerServer::Start({.listen = "127.0.0.1:0",
                                       .coordinator = absl::StrCat("127.0.0.1:", coordinator_->port()),
                                       .identity = {.host = "worker-a"},
                                       .state_dir = Dir() + "/worker-state"});
    SetProcessSecurity(server);
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = worker->release();
  }
  static void TearDownTestSuite() {
    if (worker_ != nullptr) worker_->Drain(absl::Seconds(1));
    if (coordinator_ != nullptr) coordinator_->Drain(absl::Seconds(1));
    delete worker_;
    delete coordinator_;
    SetProcessSecurity({});
  }

  // The tokens file: "token-<role>" for each role, and "token-revocable" (a view token) for
  // the revocation test to take away without touching the others, which later tests use.
  static void WriteTokens(bool revocable) {
    std::ofstream tokens(tokens_file_);
    for (const char* role : {"admin", "submit", "view", "metrics"}) {
      tokens << Sha256Hex(absl::StrCat("token-", role)) << " " << role << " " << role << "-bot\n";
    }
    if (revocable) tokens << Sha256Hex("token-revocable") << " view revocable-bot\n";
  }

  static std::vector<Caller> Callers() {
    std::vector<Caller> callers;
    callers.push_back({"plaintext", {}, std::nullopt, grpc::StatusCode::UNAVAILABLE});
    callers.push_back({"tls, no certificate or token", {.tls_ca = ca_ + "/ca.pem"}, std::nullopt});
    callers.push_back({"untrusted certificate", CertCaller(other_ca_, "mallory", ca_),
                       std::nullopt, grpc::StatusCode::UNAVAILABLE});
    callers.push_back({"expired certificate", CertCaller(ca_, "expired", ca_), std::nullopt,
                       grpc::StatusCode::UNAVAILABLE});
    callers.push_back({"unknown token", {.tls_ca = ca_ + "/ca.pem", .token = "nope"}, std::nullopt});
    for (const auto& [role, name] : std::vector<std::pair<Role, std::string>>{
             {Role::kCoordinator, "coord"}, {Role::kWorker, "worker-a"}, {Role::kAdmin, "alice"},
             {Role::kSubmit, "sam"}, {Role::kView, "vic"}}) {
      callers.push_back({absl::StrCat(RoleName(role), " certificate"), CertCaller(ca_, name, ca_),
                         Identity{role, name, "certificate"}});
    }
    for (Role role : {Role::kAdmin, Role::kSubmit, Role::kView, Role::kMetrics}) {
      callers.push_back({absl::StrCat(RoleName(role), " token"),
                         {.tls_ca = ca_ + "/ca.pem", .token = "token-" + RoleName(role)},
                         Identity{role, RoleName(role) + "-bot", "token"}});
    }
    return callers;
  }

  static inline std::string ca_, other_ca_, tokens_file_;
  static inline CoordinatorServer* coordinator_ = nullptr;
  static inline WorkerServer* worker_ = nullptr;
};

TEST(SecurityPolicyTableTest, PolicyTableMatchesTheWrittenList) {
  std::vector<std::string> served = Methods("meshrun.v1.Coordinator");
  for (const std::string& m : Methods("meshrun.v1.Worker")) served.push_back(m);
  ASSERT_GE(served.size(), 30u);
  for (const std::string& method : served) {
    auto it = ExpectedRoles().find(method);
    if (it == ExpectedRoles().end()) {
      ADD_FAILURE() << method << " is not classified: add it to ExpectedRoles() in this test "
                    << "and to RequiredRole in rpc/security_policy.cc";
      continue;
    }
    EXPECT_EQ(RoleName(RequiredRole(method)), RoleName(it->second)) << method;
  }
  for (const auto& [method, role] : ExpectedRoles()) {  // gRPC's own services and stale entries
    EXPECT_EQ(RoleName(RequiredRole(method)), RoleName(role)) << method;
    if (absl::StartsWith(method, "/meshrun.")) {
      EXPECT_NE(std::find(served.begin(), served.end(), method), served.end())
          << method << " is listed but no service has it";
    }
  }
}

TEST_F(SecurityTest, EveryRpcAgainstEveryCaller) {
  std::vector<std::pair<std::string, int>> targets;
  for (const std::string& m : Methods("meshrun.v1.Coordinator")) targets.push_back({m, coordinator_->port()});
  for (const std::string& m : Methods("meshrun.v1.Worker")) targets.push_back({m, worker_->port()});
  targets.push_back({"/grpc.health.v1.Health/Check", coordinator_->port()});
  targets.push_back({"/grpc.health.v1.Health/Check", worker_->port()});
  ASSERT_GE(targets.size(), 30u);
  int cells = 0;
  for (const Caller& caller : Callers()) {
    for (const auto& [method, port] : targets) {
      SCOPED_TRACE(absl::StrCat(caller.label, " -> ", method));
      const grpc::Status status = Call(caller.credentials, port, method);
      ++cells;
      if (caller.handshake_failure != grpc::StatusCode::OK) {
        EXPECT_EQ(status.error_code(), caller.handshake_failure) << status.error_message();
        continue;
      }
      auto need = ExpectedRoles().find(method);
      ASSERT_NE(need, ExpectedRoles().end()) << method << " is not classified in ExpectedRoles()";
      if (!caller.identity.has_value()) {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED) << status.error_message();
      } else if (Holds(caller.identity->role, need->second)) {
        EXPECT_FALSE(RefusedByPolicy(status)) << status.error_message();
        EXPECT_NE(status.error_code(), grpc::StatusCode::UNAVAILABLE) << status.error_message();
      } else {
        EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED)
            << status.error_message();
        EXPECT_TRUE(absl::StrContains(status.error_message(),
                                      "needs role " + RoleName(need->second)))
            << status.error_message();
      }
    }
  }
  EXPECT_GE(cells, 14 * 30);  // 14 kinds of caller, every RPC of both services
}

TEST_F(SecurityTest, WorkerCertificateActsOnlyAsItsHost) {
  const std::pair<std::string, std::string> kActAsAnother{"worker/worker-a",
                                                          "permission_denied act_as_another_host"};
  const int64_t refused_before = RefusalLog::Process().Counts()[kActAsAnother];
  std::shared_ptr<LogCapture> log = LogCapture::Install();
  v1::RegisterWorkerRequest request;
  request.mutable_registration()->set_host("worker-b");
  const grpc::Status as_b = Call(CertCaller(ca_, "worker-a", ca_), coordinator_->port(),
                                 "/meshrun.v1.Coordinator/RegisterWorker",
                                 request.SerializeAsString());
  EXPECT_EQ(as_b.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE(absl::StrContains(as_b.error_message(), "names host \"worker-a\""))
      << as_b.error_message();
  v1::HeartbeatRequest heartbeat;
  heartbeat.set_host("worker-b");
  EXPECT_EQ(Call(CertCaller(ca_, "worker-a", ca_), coordinator_->port(),
                 "/meshrun.v1.Coordinator/Heartbeat", heartbeat.SerializeAsString())
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_EQ(Call(CertCaller(ca_, "worker-a", ca_), coordinator_->port(),
                 "/meshrun.v1.Coordinator/StreamHeartbeats", heartbeat.SerializeAsString())
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::ReportJobProgressRequest progress;
  progress.set_job_id("job-1");
  progress.set_host("worker-b");
  EXPECT_EQ(Call(CertCaller(ca_, "worker-a", ca_), coordinator_->port(),
                 "/meshrun.v1.Coordinator/ReportJobProgress", progress.SerializeAsString())
                .error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
  v1::HostSummary summary;
  summary.set_job_id("job-1");
  summary.set_host("worker-b");
  const grpc::Status telemetry = Call(CertCaller(ca_, "worker-a", ca_), coordinator_->port(),
                                      "/meshrun.v1.Coordinator/UploadTelemetry",
                                      summary.SerializeAsString());
  EXPECT_EQ(telemetry.error_code(), grpc::StatusCode::PERMISSION_DENIED) << telemetry.error_message();
  request.mutable_registration()->set_host("worker-a");  // its own name passes the check
  const grpc::Status as_a = Call(CertCaller(ca_, "worker-a", ca_), coordinator_->port(),
                                 "/meshrun.v1.Coordinator/RegisterWorker",
                                 request.SerializeAsString());
  EXPECT_NE(as_a.error_code(), grpc::StatusCode::PERMISSION_DENIED) << as_a.error_message();
  // Refusals are counted, and logged with the caller's address (gRPC's peer string,
  // "ipv4:127.0.0.1:N") at a bounded rate: the first of a 10 s window (rpc/refusal_log.h).
  log->Uninstall();
  EXPECT_GE(RefusalLog::Process().Counts()[kActAsAnother] - refused_before, 5);
  const std::vector<std::string> refusals = log->Lines("tried to act as host \"worker-b\"");
  if (refused_before == 0) {
    EXPECT_GE(refusals.size(), 1u);
  }
  for (const std::string& line : refusals) {
    EXPECT_TRUE(absl::StrContains(line, "from ipv4:127.0.0.1:")) << line;
  }
}

// Job membership (coordinator_service/job_membership.h): worker-b is registered with a known incarnation
// and made the only member of a job; worker-a (the fixture's real worker) is not.
TEST_F(SecurityTest, OnlyTheJobsCurrentWorkersReachItsState) {
  Issue(ca_, "worker", "worker-b");
  const SecurityConfig a = CertCaller(ca_, "worker-a", ca_), b = CertCaller(ca_, "worker-b", ca_);
  const int port = coordinator_->port();
  const auto register_b = [&](const std::string& incarnation) {
    v1::RegisterWorkerRequest request;
    v1::WorkerRegistration* r = request.mutable_registration();
    r->mutable_protocol()->set_version(1);
    r->set_host("worker-b");
    r->set_address("127.0.0.1:1");
    r->set_incarnation(incarnation);
    return Call(b, port, "/meshrun.v1.Coordinator/RegisterWorker", request.SerializeAsString());
  };
  ASSERT_TRUE(register_b("inc-b1").ok());
  v1::JobSpec spec;
  spec.set_name("membership");
  const std::string job = coordinator_->jobs().Add(spec);
  ASSERT_TRUE(coordinator_->jobs()
                  .Update(job, [](v1::JobManifest& m) {
                    (*m.mutable_host_incarnations())["worker-b"] = "inc-b1";
                  })
                  .ok());
  const std::string key = absl::StrCat("collectives/", job, "/arrived/0");
  const auto kv = [&](const SecurityConfig& who, const std::string& method, const std::string& k) {
    if (method == "WaitAtBarrier") {
      v1::WaitAtBarrierRequest request;
      request.set_barrier_id(k);
      request.set_task("t0");
      request.add_tasks("t0");
      return Call(who, port, "/meshrun.v1.Coordinator/WaitAtBarrier", request.SerializeAsString());
    }
    if (method == "KeyValueList") {
      v1::KeyValueListRequest request;
      request.set_directory(k);
      return Call(who, port, "/meshrun.v1.Coordinator/KeyValueList", request.SerializeAsString());
    }
    v1::KeyValueSetRequest request;  // key = 1, value = 2: Get/TryGet/Delete parse its key
    request.set_key(k);
    request.set_value("v");
    request.set_allow_overwrite(true);
    return Call(who, port, "/meshrun.v1.Coordinator/" + method, request.SerializeAsString());
  };
  const auto denied = [](const grpc::Status& status, const std::string& why) {
    return status.error_code() == grpc::StatusCode::PERMISSION_DENIED &&
           absl::StrContains(status.error_message(), why);
  };
  // The member: its job's keys, the shared pjrt/ namespace; nothing else.
  for (const char* method : {"KeyValueSet", "KeyValueTryGet", "KeyValueGet", "KeyValueDelete",
                             "WaitAtBarrier"}) {
    SCOPED_TRACE(method);
    const grpc::Status status = kv(b, method, key);
    EXPECT_NE(status.error_code(), grpc::StatusCode::PERMISSION_DENIED) << status.error_message();
  }
  EXPECT_TRUE(kv(b, "KeyValueList", absl::StrCat("collectives/", job)).ok());
  EXPECT_TRUE(kv(b, "KeyValueSet", "pjrt/topology/0").ok());
  EXPECT_TRUE(kv(a, "KeyValueSet", "pjrt/topology/1").ok());
  EXPECT_TRUE(denied(kv(b, "KeyValueSet", "elsewhere/x"), "outside the namespaces"));
  EXPECT_TRUE(denied(kv(b, "KeyValueList", "collectives/"), "outside the namespaces"));
  EXPECT_TRUE(denied(kv(b, "KeyValueSet", "collectives/job-999999/x"), "job-999999 is unknown"));
  // Another worker: none of the job's keys, barriers, reports or telemetry.
  for (const char* method : {"KeyValueSet", "KeyValueTryGet", "KeyValueGet", "KeyValueDelete",
                             "WaitAtBarrier", "KeyValueList"}) {
    SCOPED_TRACE(method);
    const grpc::Status status = kv(a, method, key);
    EXPECT_TRUE(denied(status, "is not a member of job " + job)) << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), "members: worker-b"));
  }
  v1::ReportJobProgressRequest progress;
  progress.set_job_id(job);
  progress.set_host("worker-a");
  progress.set_state(v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(denied(Call(a, port, "/meshrun.v1.Coordinator/ReportJobProgress",
                          progress.SerializeAsString()),
                     "not a member"));
  v1::ReportCheckpointRequest checkpoint;
  checkpoint.set_job_id(job);
  checkpoint.set_host("worker-a");
  EXPECT_TRUE(denied(Call(a, port, "/meshrun.v1.Coordinator/ReportCheckpoint",
                          checkpoint.SerializeAsString()),
                     "not a member"));
  v1::PreemptJobRequest preempt;
  preempt.set_job_id(job);
  preempt.set_host("worker-a");
  EXPECT_TRUE(denied(Call(a, port, "/meshrun.v1.Coordinator/PreemptJob",
                          preempt.SerializeAsString()),
                     "not a member"));
  v1::HostSummary summary;
  summary.set_job_id(job);
  summary.set_host("worker-a");
  summary.set_step(1);
  EXPECT_TRUE(denied(Call(a, port, "/meshrun.v1.Coordinator/UploadTelemetry",
                          summary.SerializeAsString()),
                     "not a member"));
  // The member, but claiming another incarnation than the job's.
  progress.set_host("worker-b");
  progress.set_incarnation("inc-old");
  EXPECT_TRUE(denied(Call(b, port, "/meshrun.v1.Coordinator/ReportJobProgress",
                          progress.SerializeAsString()),
                     "incarnation inc-old is not the one"));
  summary.set_host("worker-b");
  summary.set_incarnation("inc-old");
  EXPECT_TRUE(denied(Call(b, port, "/meshrun.v1.Coordinator/UploadTelemetry",
                          summary.SerializeAsString()),
                     "incarnation inc-old is not the one"));
  progress.set_incarnation("inc-b1");
  const grpc::Status member = Call(b, port, "/meshrun.v1.Coordinator/ReportJobProgress",
                                   progress.SerializeAsString());
  EXPECT_NE(member.error_code(), grpc::StatusCode::PERMISSION_DENIED) << member.error_message();
  // worker-b restarts: the job's incarnation is no longer current, so its keys are closed.
  ASSERT_TRUE(register_b("inc-b2").ok());
  EXPECT_TRUE(denied(kv(b, "KeyValueSet", key), "no longer current"));
  EXPECT_TRUE(denied(Call(b, port, "/meshrun.v1.Coordinator/ReportJobProgress",
                          progress.SerializeAsString()),
                     "no longer current"));
}

// Telemetry relays (docs/scale.md): the coordinator takes a host's relayed summaries only from
// the relay its job names for that host, and only for a current member; a refusal is an ack
// for that host, and the stream goes on.
TEST_F(SecurityTest, OnlyTheNamedRelayForwardsAHostsTelemetry) {
  Issue(ca_, "worker", "worker-r");
  Issue(ca_, "worker", "worker-m");
  v1::JobSpec spec;
  spec.set_name("relayed");
  const std::string job = coordinator_->jobs().Add(spec);
  ASSERT_TRUE(coordinator_->jobs()
                  .Update(job, [](v1::JobManifest& m) {
                    (*m.mutable_host_incarnations())["worker-r"] = "inc-r";
                    (*m.mutable_host_incarnations())["worker-m"] = "inc-m";
                    (*m.mutable_telemetry_relays())["worker-m"] = "worker-r";
                  })
                  .ok());
  // One batch on a RelayTelemetry stream of `caller`; the acks that come back.
  const auto relay = [&](const std::string& caller, const std::vector<v1::HostSummary>& batch) {
    auto stub = v1::Coordinator::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", coordinator_->port()),
        MakeChannelCredentials(CertCaller(ca_, caller, ca_))));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub->RelayTelemetry(&context);
    v1::HostSummaryBatch out;
    for (const v1::HostSummary& summary : batch) *out.add_summaries() = summary;
    EXPECT_TRUE(stream->Write(out));
    stream->WritesDone();
    std::vector<v1::UploadTelemetryAck> acks;
    v1::UploadTelemetryAckBatch in;
    while (stream->Read(&in)) acks.insert(acks.end(), in.acks().begin(), in.acks().end());
    EXPECT_TRUE(stream->Finish().ok());  // refusals travel in acks, not as the stream's end
    return acks;
  };
  const auto summary = [&](const std::string& host, const std::string& incarnation) {
    v1::HostSummary s;
    s.set_job_id(job);
    s.set_host(host);
    s.set_incarnation(incarnation);
    s.set_step(1);
    return s;
  };
  const auto refused = [](const v1::UploadTelemetryAck& ack, const std::string& host,
                          const std::string& why) {
    return ack.host() == host &&
           ack.error_code() == static_cast<int32_t>(grpc::StatusCode::PERMISSION_DENIED) &&
           absl::StrContains(ack.error_message(), why);
  };
  // A worker that is not the named relay; the named relay for a host it does not relay (its
  // own, which it uploads itself); the member's summary with a stale incarnation.
  std::vector<v1::UploadTelemetryAck> acks = relay("worker-a", {summary("worker-m", "inc-m")});
  ASSERT_EQ(acks.size(), 1u);
  EXPECT_TRUE(refused(acks[0], "worker-m", "the job names worker-r as its relay"))
      << acks[0].error_message();
  acks = relay("worker-r", {summary("worker-r", "inc-r"), summary("worker-m", "inc-old"),
                            summary("worker-m", "inc-m")});
  ASSERT_EQ(acks.size(), 3u);
  EXPECT_TRUE(refused(acks[0], "worker-r", "names no relay for that host"))
      << acks[0].error_message();
  EXPECT_TRUE(refused(acks[1], "worker-m", "incarnation inc-old is not the one"))
      << acks[1].error_message();
  // The named relay, for a current member: past the check (the job collects no telemetry, so
  // the telemetry path answers NOT_FOUND), and the stream took all three.
  EXPECT_EQ(acks[2].host(), "worker-m");
  EXPECT_EQ(acks[2].error_code(), static_cast<int32_t>(grpc::StatusCode::NOT_FOUND))
      << acks[2].error_message();
}

// Clients check who answers: a server with a worker's certificate posing as the coordinator,
// or the worker of another host, fails the handshake naming both identities.
TEST_F(SecurityTest, ClientsCheckTheServersIdentity) {
  SetProcessSecurity(CertCaller(ca_, "worker-a", ca_));  // the impostor's own certificate
  auto impostor = CoordinatorServer::Start(
      {.listen = "127.0.0.1:0", .state_dir = Dir() + "/impostor-state", .pjrt_plugin = ""});
  SecurityConfig server = CertCaller(ca_, "coord", ca_);
  server.auth_tokens_file = tokens_file_;
  SetProcessSecurity(server);
  ASSERT_TRUE(impostor.ok()) << impostor.status();
  const auto call = [](const SecurityConfig& who, int port, const ExpectedServer& expect,
                       const std::string& method) {
    auto channel = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port),
                                       MakeChannelCredentials(who, expect));
    grpc::GenericStub stub(channel);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1500));
    grpc::Slice slice("");
    grpc::ByteBuffer request(&slice, 1), response;
    std::promise<grpc::Status> done;
    stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                   [&](grpc::Status status) { done.set_value(std::move(status)); });
    return done.get_future().get();
  };
  const SecurityConfig alice = CertCaller(ca_, "alice", ca_);
  const std::string list = "/meshrun.v1.Coordinator/ListJobs";
  const ExpectedServer coordinator{Role::kCoordinator, ""};
  EXPECT_TRUE(call(alice, coordinator_->port(), coordinator, list).ok());
  const grpc::Status posing = call(alice, (*impostor)->port(), coordinator, list);
  EXPECT_EQ(posing.error_code(), grpc::StatusCode::UNAVAILABLE) << posing.error_message();
  EXPECT_TRUE(absl::StrContains(posing.error_message(),
                                "expected spiffe://<cluster>/coordinator/<any name>"))
      << posing.error_message();
  EXPECT_TRUE(absl::StrContains(posing.error_message(), "presented spiffe://test/worker/worker-a"))
      << posing.error_message();
  // A token is never sent to it either: the handshake fails first.
  const SecurityConfig admin_token{.tls_ca = ca_ + "/ca.pem", .token = "token-admin"};
  EXPECT_EQ(call(admin_token, (*impostor)->port(), coordinator, list).error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // The coordinator's calls to a worker: the host it registered, nobody else.
  const SecurityConfig coord = CertCaller(ca_, "coord", ca_);
  const std::string status = "/meshrun.v1.Worker/GetStatus";
  EXPECT_TRUE(call(coord, worker_->port(), {Role::kWorker, "worker-a"}, status).ok());
  const grpc::Status other = call(coord, worker_->port(), {Role::kWorker, "worker-b"}, status);
  EXPECT_EQ(other.error_code(), grpc::StatusCode::UNAVAILABLE) << other.error_message();
  EXPECT_TRUE(absl::StrContains(other.error_message(), "expected spiffe://<cluster>/worker/worker-b"))
      << other.error_message();
  EXPECT_TRUE(absl::StrContains(other.error_message(), "presented spiffe://test/worker/worker-a"))
      << other.error_message();
  (*impostor)->Drain(absl::Seconds(1));
}

TEST_F(SecurityTest, RevokedTokenStopsWorkingAfterReload) {
  const SecurityConfig revoked{.tls_ca = ca_ + "/ca.pem", .token = "token-revocable"};
  const std::string list = "/meshrun.v1.Coordinator/ListJobs";
  ASSERT_TRUE(Call(revoked, coordinator_->port(), list).ok());
  WriteTokens(/*revocable=*/false);
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));  // the file is rechecked each 1 s
  EXPECT_EQ(Call(revoked, coordinator_->port(), list).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  for (const char* kept : {"token-admin", "token-view"}) {
    EXPECT_TRUE(Call({.tls_ca = ca_ + "/ca.pem", .token = kept}, coordinator_->port(), list).ok())
        << kept;
  }
}

// A coordinator whose certificate and CA files are replaced while it runs: new connections
// use the new ones, with no restart.
TEST(SecurityRotationTest, RotatedCertificatePickedUpWithoutRestart) {
  const std::string dir = Dir() + "/rotation";
  const std::string old_ca = dir + "/old", new_ca = dir + "/new", live = dir + "/live";
  ASSERT_TRUE(CreateClusterCa(old_ca, "test", 30).ok());
  ASSERT_TRUE(CreateClusterCa(new_ca, "test", 30).ok());
  std::filesystem::create_directories(live);
  for (const std::string& ca : {old_ca, new_ca}) {
    Issue(ca, "coordinator", "coord");
    Issue(ca, "admin", "alice");
  }
  const auto install = [&](const std::string& from) {
    for (const char* file : {"coord.key", "coord.pem", "ca.pem"}) {
      std::filesystem::copy_file(from + "/" + file, live + "/" + file + ".tmp",
                                 std::filesystem::copy_options::overwrite_existing);
      std::filesystem::rename(live + "/" + file + ".tmp", live + "/" + file);
    }
  };
  install(old_ca);
  SetProcessSecurity({.tls_cert = live + "/coord.pem", .tls_key = live + "/coord.key",
                      .tls_ca = live + "/ca.pem", .tls_refresh_seconds = 1});
  auto coordinator = CoordinatorServer::Start(
      {.listen = "127.0.0.1:0", .state_dir = dir + "/state", .pjrt_plugin = ""});
  SetProcessSecurity({});
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  const int port = (*coordinator)->port();
  const std::string list = "/meshrun.v1.Coordinator/ListJobs";
  const SecurityConfig old_client = CertCaller(old_ca, "alice", old_ca);
  const SecurityConfig new_client = CertCaller(new_ca, "alice", new_ca);
  EXPECT_TRUE(Call(old_client, port, list).ok());
  EXPECT_EQ(Call(new_client, port, list).error_code(), grpc::StatusCode::UNAVAILABLE);
  install(new_ca);
  grpc::Status status;
  for (int i = 0; i < 40 && !(status = Call(new_client, port, list)).ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  EXPECT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(Call(old_client, port, list).error_code(), grpc::StatusCode::UNAVAILABLE);
  (*coordinator)->Drain(absl::Seconds(1));
}

TEST(SecurityBindTest, PlaintextNonLoopbackNeedsInsecure) {
  EXPECT_TRUE(CheckPlaintextBind({}, "listen", "127.0.0.1").ok());
  EXPECT_TRUE(CheckPlaintextBind({}, "listen", "::1").ok());
  absl::Status refused = CheckPlaintextBind({}, "listen", "::");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(), "--insecure")) << refused;
  EXPECT_TRUE(CheckPlaintextBind({.tls_ca = "x"}, "listen", "0.0.0.0").ok());
  EXPECT_FALSE(ServingInsecurely());
  EXPECT_TRUE(CheckPlaintextBind({.insecure = true}, "listen", "0.0.0.0").ok());
  EXPECT_TRUE(ServingInsecurely());
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Security review, round two (issue 27), items 9, 10 and 13: `meshrun certs issue` writes keys
// 0600 from the start, never overwrites the CA's own files, and gives no other role a name a
// client would take for the coordinator's.
TEST(SecurityCertsTest, IssueKeepsKeysPrivateAndTheCaIntact) {
  const std::string ca = testing::FreshScratchDir("certs_issue");
  ASSERT_TRUE(CreateClusterCa(ca, "prod", 30).ok());
  const std::string ca_key = ReadAll(ca + "/ca.key"), ca_pem = ReadAll(ca + "/ca.pem");
  const mode_t old_umask = umask(0);  // what the process allows must not widen the key
  absl::StatusOr<std::string> issued =
      IssueCertificate({.ca_dir = ca, .role = "worker", .name = "host-0", .days = 30});
  umask(old_umask);
  ASSERT_TRUE(issued.ok()) << issued.status();
  EXPECT_EQ(std::filesystem::status(ca + "/host-0.key").permissions() &
                std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  for (const IssueRequest& request : std::vector<IssueRequest>{
           {.ca_dir = ca, .role = "worker", .name = "ca"},
           {.ca_dir = ca, .role = "admin", .name = "x", .out_key = ca + "/ca.key"},
           {.ca_dir = ca, .role = "worker", .name = "x", .out_cert = ca + "/./ca.pem"}}) {
    absl::Status refused = IssueCertificate(request).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << request.name;
    EXPECT_TRUE(absl::StrContains(refused.message(), "is the CA's")) << refused;
  }
  EXPECT_EQ(ReadAll(ca + "/ca.key"), ca_key);
  EXPECT_EQ(ReadAll(ca + "/ca.pem"), ca_pem);
  for (const std::string name : {"MESHRUN-COORDINATOR", "Meshrun-Coordinator",
                                 "meshrun-coordinator.", ".meshrun-coordinator"}) {
    absl::Status refused =
        IssueCertificate({.ca_dir = ca, .role = "worker", .name = name}).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << name;
  }
  EXPECT_TRUE(IssueCertificate({.ca_dir = ca, .role = "coordinator", .name = "meshrun-coordinator"})
                  .ok());
  std::filesystem::remove_all(ca);
}

}  // namespace
}  // namespace meshrun::services
