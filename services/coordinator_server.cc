#include "services/coordinator_server.h"

#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/protocol.h"
#include "common/status_macros.h"
#include "services/proto_convert.h"
#include "services/server_support.h"
#include "services/unary_reactor.h"

namespace meshrun::services {

absl::Status CoordinatorRpcHandler::GetSupportedVersions(const v1::GetSupportedVersionsRequest&,
                                                         v1::SupportedVersions* response) {
  response->set_min_version(kProtocolMinVersion);
  response->set_max_version(kProtocolMaxVersion);
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::RegisterWorker(const v1::RegisterWorkerRequest& request,
                                                   v1::RegisterWorkerResponse* response) {
  if (!request.has_registration()) {
    return absl::InvalidArgumentError("registration is missing");
  }
  RETURN_IF_ERROR(CheckProtocolVersion(request.registration().protocol().version()));
  if (draining_) return absl::UnavailableError("coordinator is draining; register elsewhere");
  coordinator::WorkerInfo info = FromProto(request.registration());
  RETURN_IF_ERROR(registry_->Register(info));
  spdlog::info("worker {} registered (incarnation {}, address {}, runtime {}, {} devices)",
               info.host, info.incarnation, info.address, runtime::ToString(info.runtime),
               info.devices.size());
  response->set_heartbeat_interval_millis(
      absl::ToInt64Milliseconds(registry_->heartbeat_interval()));
  response->set_heartbeat_timeout_millis(absl::ToInt64Milliseconds(registry_->heartbeat_timeout()));
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::Heartbeat(const v1::HeartbeatRequest& request,
                                              v1::HeartbeatResponse*) {
  if (request.host().empty()) return absl::InvalidArgumentError("host is empty");
  return registry_->Heartbeat(request.host(), request.incarnation());
}

absl::Status CoordinatorRpcHandler::DeregisterWorker(const v1::DeregisterWorkerRequest& request,
                                                     v1::DeregisterWorkerResponse*) {
  if (request.host().empty()) return absl::InvalidArgumentError("host is empty");
  RETURN_IF_ERROR(registry_->Deregister(request.host(), request.incarnation()));
  spdlog::info("worker {} left (incarnation {})", request.host(), request.incarnation());
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::ListWorkers(const v1::ListWorkersRequest&,
                                                v1::ListWorkersResponse* response) {
  for (const coordinator::WorkerEntry& entry : registry_->List()) {
    v1::WorkerStatus* status = response->add_workers();
    *status->mutable_registration() = ToProto(entry.info);
    status->set_state(ToProto(entry.state));
    status->set_last_heartbeat_unix_micros(absl::ToUnixMicros(entry.last_heartbeat));
    status->set_state_reason(entry.state_reason);
  }
  return absl::OkStatus();
}

// The thin callback-API adapter.
class CoordinatorServer::Service final : public v1::Coordinator::CallbackService {
 public:
  explicit Service(CoordinatorRpcHandler* handler) : handler_(handler) {}

  grpc::ServerUnaryReactor* GetSupportedVersions(grpc::CallbackServerContext* context,
                                                 const v1::GetSupportedVersionsRequest* request,
                                                 v1::SupportedVersions* response) override {
    return FinishUnary(context, [&] { return handler_->GetSupportedVersions(*request, response); });
  }
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override {
    return FinishUnary(context, [&] { return handler_->RegisterWorker(*request, response); });
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override {
    return FinishUnary(context, [&] { return handler_->Heartbeat(*request, response); });
  }
  grpc::ServerUnaryReactor* DeregisterWorker(grpc::CallbackServerContext* context,
                                             const v1::DeregisterWorkerRequest* request,
                                             v1::DeregisterWorkerResponse* response) override {
    return FinishUnary(context, [&] { return handler_->DeregisterWorker(*request, response); });
  }
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override {
    return FinishUnary(context, [&] { return handler_->ListWorkers(*request, response); });
  }

 private:
  CoordinatorRpcHandler* const handler_;
};

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(Config config) {
  RETURN_IF_ERROR(ParseHostPort("listen", config.listen).status());
  RETURN_IF_ERROR(PrepareStateDir("state_dir", config.state_dir));
  if (config.heartbeat_timeout < absl::Milliseconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heartbeat_timeout=", absl::FormatDuration(config.heartbeat_timeout),
        " is too short; use at least 10ms (the default is 10s)"));
  }
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  ASSIGN_OR_RETURN(server->registry_,
                   coordinator::WorkerRegistry::Create(
                       {.heartbeat_timeout = config.heartbeat_timeout, .clock = config.clock}));
  server->handler_ = std::make_unique<CoordinatorRpcHandler>(server->registry_.get());
  server->service_ = std::make_unique<Service>(server->handler_.get());
  ASSIGN_OR_RETURN(StartedServer started,
                   StartGrpcServer("listen", config.listen, {server->service_.get()}));
  server->server_ = std::move(started.server);
  server->port_ = started.port;
  server->sweeper_ = std::thread([s = server.get()] { s->SweepLiveness(); });
  spdlog::info("coordinator listening on port {} (state {}, heartbeat timeout {})", server->port_,
               config.state_dir, absl::FormatDuration(config.heartbeat_timeout));
  return server;
}

void CoordinatorServer::SweepLiveness() {
  const absl::Duration period = registry_->heartbeat_timeout() / 4;
  while (!stop_sweeper_.WaitForNotificationWithTimeout(period)) {
    for (const coordinator::WorkerEntry& dead : registry_->ExpireOverdue()) {
      spdlog::warn("worker {} (incarnation {}) is DEAD: {}", dead.info.host,
                   dead.info.incarnation, dead.state_reason);
    }
  }
}

void CoordinatorServer::Drain(absl::Duration deadline) {
  if (drained_.exchange(true) || server_ == nullptr) return;  // null: Start() failed
  handler_->SetDraining();
  DrainServer(*server_, deadline);
  stop_sweeper_.Notify();
  sweeper_.join();
}

CoordinatorServer::~CoordinatorServer() { Drain(absl::ZeroDuration()); }

}  // namespace meshrun::services
