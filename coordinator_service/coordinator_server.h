// The coordinator process's service: the worker registry behind the Coordinator gRPC service,
// with health, reflection and a liveness sweeper. Used by meshrun-coordinator and by tests,
// which start it on 127.0.0.1:0.
//
// Lifetime: Start() returns a running server; Drain() (or the destructor) stops it. The
// clock in Config must outlive the server.
// Thread-safety: port() and Drain() may be called from any thread; Drain() is idempotent.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "coordinator/executable_cache.h"
#include "coordinator/job_table.h"
#include "coordinator/key_value_store.h"
#include "coordinator/worker_registry.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "coordinator_service/coordinator_limits.h"
#include "coordinator_service/coordinator_rpc_handler.h"
#include "coordinator_service/dashboard_api.h"
#include "coordinator_service/heartbeat_stream.h"
#include "coordinator_service/http_server.h"
#include "coordinator_service/job_launcher.h"
#include "coordinator_service/job_membership.h"
#include "runtime/runtime.h"

namespace meshrun::services {

class CoordinatorServer {
 public:
  struct Config {
    std::string listen = "[::]:7070";
    std::string state_dir;  // required; created if missing
    absl::Duration heartbeat_timeout = absl::Seconds(10);
    // The PJRT plugin the coordinator compiles with; empty: it cannot compile, and jobs fail
    // at ASSIGNED saying so.
    std::string pjrt_plugin;
    int64_t cpu_devices = 8;  // CPU plugin only: devices of the compiling client
    // libtpu to compile TPU jobs with for the slice their workers form (target_compilers.h);
    // empty: TPU jobs compile on their first worker.
    std::string tpu_compiler_plugin;
    uint64_t cache_max_bytes = uint64_t{16} << 30;
    absl::Duration telemetry_grace = absl::Seconds(5);  // wait for hosts before "partial"
    // HTTP (Prometheus /metrics, the web dashboard and its JSON/SSE API); empty: no HTTP port.
    std::string http_listen;
    std::string web_root;  // the dashboard's built assets (index.html); empty: API only
    // Its event streams (/api/watch), capped per identity and in all, admin apart
    // (HttpServer::Config).
    int http_max_streams = 8;
    int http_max_streams_per_identity = 2;
    int http_max_admin_streams = 2;
    // Automatic recovery: how long a restarted job waits for enough healthy hosts.
    absl::Duration restart_wait = absl::Seconds(60);
    // A running job none of whose hosts completed a step for this long is failed, naming the
    // host that stopped first (docs/liveness.md); zero: off.
    absl::Duration hang_timeout = absl::ZeroDuration();
    // A job of more hosts than this has its telemetry relayed in groups of this many
    // (docs/scale.md, "Telemetry relays"); 0: every host uploads its own.
    int telemetry_relay_hosts = 64;
    CoordinatorLimits limits;  // limits (docs/limits.md)
    Clock* clock = &RealClock();
  };

  // Errors: INVALID_ARGUMENT (bad listen or http_listen address, or timeout),
  // FAILED_PRECONDITION (state directory unusable, or its executable cache held by another
  // coordinator), UNAVAILABLE (cannot listen); each names the flag; the plugin's error when
  // --pjrt_plugin fails to load.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(Config config);
  ~CoordinatorServer();

  int port() const { return port_; }
  // The telemetry path (tests and benchmarks drive it without workers).
  CoordinatorTelemetry& telemetry() { return *telemetry_; }
  coordinator::JobTable& jobs() { return *jobs_; }  // tests and benchmarks seed jobs
  // The bound HTTP port; 0 when http_listen is empty.
  int http_port() const { return http_ ? http_->port() : 0; }

  // Refuses new registrations, gives in-flight calls until `deadline`, then stops.
  void Drain(absl::Duration deadline);

 private:
  class Service;
  CoordinatorServer() = default;
  void SweepLiveness();
  // Once the workers had time to come back after a restart: fails each job restored RUNNING
  // whose workers did not re-register, naming them.
  void CheckRestoredJobs();
  // Records a job's first non-finite step in its manifest (CoordinatorTelemetry::Config).
  static std::function<void(const std::string&, int64_t, const std::string&)> NonFiniteRecorder(
      CoordinatorServer* server);
  // limits: --history_retention, and finished jobs past --job_retention/--max_finished_jobs.
  void ForgetUnusedChannels();  // sweeper only: closes those of workers no longer alive there
  void PruneFinished();     // sweeper only: every minute, or sooner past --max_finished_jobs
  absl::Time pruned_at_;    // sweeper only
  CoordinatorLimits limits_;

  std::unique_ptr<coordinator::WorkerRegistry> registry_;
  std::unique_ptr<coordinator::KeyValueStore> kv_;
  std::unique_ptr<coordinator::JobTable> jobs_;
  std::unique_ptr<coordinator::ExecutableCache> cache_;
  std::unique_ptr<runtime::Runtime> runtime_;
  std::unique_ptr<TargetCompilers> target_compilers_;  // null without --tpu_compiler_plugin
  std::unique_ptr<CoordinatorTelemetry> telemetry_;
  std::unique_ptr<coordinator::ProgressMonitor> progress_;  // outlives launcher_
  std::unique_ptr<SubmitAdmission> admission_;  // outlives launcher_ and handler_
  std::unique_ptr<JobLauncher> launcher_;
  std::unique_ptr<CoordinatorRpcHandler> handler_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  // StreamHeartbeats on its own queue and thread (heartbeat_stream.h); shut down after server_.
  std::unique_ptr<grpc::ServerCompletionQueue> heartbeat_queue_;
  std::unique_ptr<HeartbeatStreams> heartbeats_;
  std::thread heartbeat_thread_;
  int port_ = 0;
  std::unique_ptr<DashboardApi> dashboard_;
  std::unique_ptr<HttpServer> http_;
  absl::Notification stop_sweeper_;
  std::thread sweeper_;
  // Jobs restored RUNNING after a restart, checked once at restored_check_at_ (sweeper only).
  std::vector<std::string> restored_running_;
  absl::Time restored_check_at_;
  Clock* clock_ = &RealClock();
  std::atomic<bool> drained_{false};
};

}  // namespace meshrun::services
