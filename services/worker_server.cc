#include "services/worker_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/protocol.h"
#include "common/status_macros.h"
#include "services/server_support.h"
#include "services/unary_reactor.h"

namespace meshrun::services {
namespace {

std::string FreshIncarnation() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

}  // namespace

class WorkerServer::Service final : public v1::Worker::CallbackService {
 public:
  explicit Service(WorkerServer* owner) : owner_(owner) {}

  grpc::ServerUnaryReactor* GetSupportedVersions(
      grpc::CallbackServerContext* context, const v1::GetWorkerSupportedVersionsRequest*,
      v1::SupportedVersions* response) override {
    return FinishUnary(context, [&] {
      response->set_min_version(kProtocolMinVersion);
      response->set_max_version(kProtocolMaxVersion);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest*,
                                      v1::WorkerStatusReport* response) override {
    return FinishUnary(context, [&] {
      response->set_host(owner_->config_.identity.host);
      response->set_incarnation(owner_->incarnation());
      return absl::OkStatus();
    });
  }

 private:
  WorkerServer* const owner_;
};

WorkerServer::WorkerServer(Config config)
    : config_(std::move(config)), incarnation_(FreshIncarnation()) {}

std::string WorkerServer::incarnation() const {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(Config config) {
  ASSIGN_OR_RETURN(HostPort listen, ParseHostPort("listen", config.listen));
  RETURN_IF_ERROR(ParseHostPort("coordinator", config.coordinator).status());
  if (!config.advertise_address.empty()) {
    RETURN_IF_ERROR(ParseHostPort("advertise_address", config.advertise_address).status());
  }
  RETURN_IF_ERROR(PrepareStateDir("state_dir", config.state_dir));
  std::unique_ptr<WorkerServer> server(new WorkerServer(std::move(config)));
  server->service_ = std::make_unique<Service>(server.get());
  ASSIGN_OR_RETURN(StartedServer started,
                   StartGrpcServer("listen", server->config_.listen, {server->service_.get()}));
  server->server_ = std::move(started.server);
  server->port_ = started.port;
  if (server->config_.advertise_address.empty()) {
    const bool wildcard = listen.host == "0.0.0.0" || listen.host == "::";
    const std::string host = wildcard ? server->config_.identity.host : listen.host;
    server->advertise_address_ = host.find(':') != std::string::npos
                                     ? absl::StrCat("[", host, "]:", server->port_)
                                     : absl::StrCat(host, ":", server->port_);
  } else {
    server->advertise_address_ = server->config_.advertise_address;
  }
  server->coordinator_ = v1::Coordinator::NewStub(MakeChannel(server->config_.coordinator));
  server->loop_ = std::thread([s = server.get()] { s->RegistrationLoop(); });
  spdlog::info("worker {} listening on port {} (advertised as {}), coordinator {}",
               server->config_.identity.host, server->port_, server->advertise_address_,
               server->config_.coordinator);
  return server;
}

absl::Status WorkerServer::Register() {
  v1::RegisterWorkerRequest request;
  v1::WorkerRegistration* registration = request.mutable_registration();
  registration->mutable_protocol()->set_version(kProtocolVersion);
  registration->set_host(config_.identity.host);
  registration->set_address(advertise_address_);
  registration->set_slice_id(config_.identity.slice_id);
  registration->set_num_slices(config_.identity.num_slices);
  registration->set_worker_index(config_.identity.worker_index);
  for (const std::string& name : config_.identity.slice_hostnames) {
    registration->add_slice_hostnames(name);
  }
  registration->set_incarnation(incarnation());
  v1::RegisterWorkerResponse response;
  auto context = ContextWithTimeout(config_.rpc_timeout);
  RETURN_IF_ERROR(FromGrpcStatus(coordinator_->RegisterWorker(context.get(), request, &response)));
  heartbeat_interval_millis_ = std::max<int64_t>(1, response.heartbeat_interval_millis());
  return absl::OkStatus();
}

absl::Status WorkerServer::Heartbeat() {
  v1::HeartbeatRequest request;
  request.set_host(config_.identity.host);
  request.set_incarnation(incarnation());
  v1::HeartbeatResponse response;
  auto context = ContextWithTimeout(config_.rpc_timeout);
  return FromGrpcStatus(coordinator_->Heartbeat(context.get(), request, &response));
}

void WorkerServer::RegistrationLoop() {
  absl::Duration backoff = absl::Milliseconds(100);
  int failures = 0;
  while (!stop_loop_.HasBeenNotified()) {
    absl::Duration wait;
    if (!registered_) {
      absl::Status status = Register();
      if (status.ok()) {
        registered_ = true;
        failures = 0;
        backoff = absl::Milliseconds(100);
        spdlog::info("registered with coordinator {} as incarnation {}", config_.coordinator,
                     incarnation());
        wait = absl::Milliseconds(heartbeat_interval_millis_.load());
      } else {
        // Log the first failure and then every tenth, so a long outage does not flood logs.
        if (failures++ % 10 == 0) {
          spdlog::warn("cannot register with coordinator {}: {} (retrying)", config_.coordinator,
                       status.ToString());
        }
        if (status.code() == absl::StatusCode::kAlreadyExists) {
          absl::MutexLock lock(&mu_);
          incarnation_ = FreshIncarnation();
        }
        wait = backoff;
        backoff = std::min(backoff * 2, absl::Seconds(5));
      }
    } else {
      absl::Status status = Heartbeat();
      if (absl::IsNotFound(status)) {
        spdlog::warn("coordinator forgot this worker ({}); registering again", status.ToString());
        registered_ = false;
      } else if (absl::IsFailedPrecondition(status)) {
        absl::MutexLock lock(&mu_);
        incarnation_ = FreshIncarnation();
        spdlog::warn("{}; registering as fresh incarnation {}", status.ToString(), incarnation_);
        registered_ = false;
      } else if (!status.ok()) {
        spdlog::warn("heartbeat failed: {}", status.ToString());
      }
      wait = registered_ ? absl::Milliseconds(heartbeat_interval_millis_.load()) : absl::ZeroDuration();
    }
    stop_loop_.WaitForNotificationWithTimeout(wait);
  }
}

void WorkerServer::Drain(absl::Duration deadline) {
  if (drained_.exchange(true) || server_ == nullptr) return;  // null: Start() failed
  stop_loop_.Notify();
  loop_.join();
  if (registered_) {
    v1::DeregisterWorkerRequest request;
    request.set_host(config_.identity.host);
    request.set_incarnation(incarnation());
    v1::DeregisterWorkerResponse response;
    auto context = ContextWithTimeout(std::min(config_.rpc_timeout, deadline));
    grpc::Status status = coordinator_->DeregisterWorker(context.get(), request, &response);
    if (!status.ok()) spdlog::warn("deregistration failed: {}", status.error_message());
    registered_ = false;
  }
  DrainServer(*server_, deadline);
}

WorkerServer::~WorkerServer() { Drain(absl::ZeroDuration()); }

}  // namespace meshrun::services
