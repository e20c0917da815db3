// The coordinator process's service: the worker registry behind the Coordinator gRPC service,
// with health, reflection and a liveness sweeper. Used by meshrun-coordinator and by tests,
// which start it on 127.0.0.1:0.
//
// Lifetime: Start() returns a running server; Drain() (or the destructor) stops it. The
// clock in Config must outlive the server.
// Thread-safety: port() and Drain() may be called from any thread; Drain() is idempotent.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/worker_registry.h"
#include "meshrun/v1/coordinator.grpc.pb.h"

namespace meshrun::services {

// Maps Coordinator RPCs onto the logic classes; no gRPC types beyond the messages.
// Thread-safety: safe to call concurrently.
class CoordinatorRpcHandler {
 public:
  explicit CoordinatorRpcHandler(coordinator::WorkerRegistry* registry) : registry_(registry) {}

  // Once set, registrations are refused with UNAVAILABLE.
  void SetDraining() { draining_ = true; }

  absl::Status GetSupportedVersions(const v1::GetSupportedVersionsRequest& request,
                                    v1::SupportedVersions* response);
  absl::Status RegisterWorker(const v1::RegisterWorkerRequest& request,
                              v1::RegisterWorkerResponse* response);
  absl::Status Heartbeat(const v1::HeartbeatRequest& request, v1::HeartbeatResponse* response);
  absl::Status DeregisterWorker(const v1::DeregisterWorkerRequest& request,
                                v1::DeregisterWorkerResponse* response);
  absl::Status ListWorkers(const v1::ListWorkersRequest& request,
                           v1::ListWorkersResponse* response);

 private:
  coordinator::WorkerRegistry* const registry_;
  std::atomic<bool> draining_{false};
};

class CoordinatorServer {
 public:
  struct Config {
    std::string listen = "[::]:7070";
    std::string state_dir;  // required; created if missing
    absl::Duration heartbeat_timeout = absl::Seconds(10);
    Clock* clock = &RealClock();
  };

  // Errors: INVALID_ARGUMENT (bad listen address or timeout), FAILED_PRECONDITION (state
  // directory unusable), UNAVAILABLE (cannot listen); each names the flag.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(Config config);
  ~CoordinatorServer();

  int port() const { return port_; }

  // Refuses new registrations, gives in-flight calls until `deadline`, then stops.
  void Drain(absl::Duration deadline);

 private:
  class Service;
  CoordinatorServer() = default;
  void SweepLiveness();

  std::unique_ptr<coordinator::WorkerRegistry> registry_;
  std::unique_ptr<CoordinatorRpcHandler> handler_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  absl::Notification stop_sweeper_;
  std::thread sweeper_;
  std::atomic<bool> drained_{false};
};

}  // namespace meshrun::services
