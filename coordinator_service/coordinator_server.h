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
#include "services/dashboard_api.h"
#include "services/coordinator_limits.h"
#include "services/http_server.h"
#include "services/job_launcher.h"
#include "services/job_membership.h"
#include "worker/runtime/runtime.h"

namespace meshrun::services {

// A manifest as clients and the history see it: without the program bytes that were submitted.
v1::JobManifest WithoutPrograms(v1::JobManifest job);

// Maps Coordinator RPCs onto the logic classes; no gRPC types beyond the messages.
// Thread-safety: safe to call concurrently.
class CoordinatorRpcHandler {
 public:
  CoordinatorRpcHandler(coordinator::WorkerRegistry* registry, coordinator::KeyValueStore* kv,
                        coordinator::JobTable* jobs, JobLauncher* launcher,
                        CoordinatorTelemetry* telemetry)
      : registry_(registry), kv_(kv), jobs_(jobs), launcher_(launcher), telemetry_(telemetry) {}

  CoordinatorTelemetry& telemetry() { return *telemetry_; }
  // security: which worker may touch which job's state.
  const JobMembership& membership() const { return membership_; }

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

  // `client` as ClientKey names the caller (rate limits); empty: not limited.
  absl::Status SubmitJob(const v1::SubmitJobRequest& request, v1::SubmitJobResponse* response,
                         const std::string& client = "");
  void SetAdmission(SubmitAdmission* admission) { admission_ = admission; }
  absl::Status GetJob(const v1::GetJobRequest& request, v1::JobManifest* response);
  absl::Status ListJobs(const v1::ListJobsRequest& request, v1::ListJobsResponse* response);
  absl::Status CancelJob(const v1::CancelJobRequest& request, v1::CancelJobResponse*);
  absl::Status ReportJobProgress(const v1::ReportJobProgressRequest& request,
                                 v1::ReportJobProgressResponse*);
  absl::Status ReportCheckpoint(const v1::ReportCheckpointRequest& request,
                                v1::ReportCheckpointResponse*) {
    return launcher_->ReportCheckpoint(request);
  }
  absl::Status CheckpointJob(const v1::CheckpointJobRequest& request,
                             v1::CheckpointJobResponse* response) {
    if (request.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
    ASSIGN_OR_RETURN(const int64_t step, launcher_->CheckpointNow(request.job_id()));
    response->set_step(step);
    return absl::OkStatus();
  }
  absl::Status PreemptJob(const v1::PreemptJobRequest& request, v1::PreemptJobResponse* response) {
    ASSIGN_OR_RETURN(const int64_t step, launcher_->Preempt(request));
    response->set_step(step);
    return absl::OkStatus();
  }

  // Ask the workers (bounded by a 5 s deadline each); the server runs these (and every call
  // that waits on disk or workers) off gRPC's callback threads (unary_reactor.h).
  absl::Status GetMetrics(const v1::GetMetricsRequest& request, v1::GetMetricsResponse* response);
  absl::Status GetDeviceMemory(const v1::GetDeviceMemoryRequest& request,
                               v1::GetDeviceMemoryResponse* response);
  // Relays Worker.Drain to the alive worker of request.host. Errors: INVALID_ARGUMENT (no
  // host), NOT_FOUND / FAILED_PRECONDITION (no alive worker of that name), the worker's.
  absl::Status DrainWorker(const v1::DrainWorkerRequest& request, v1::DrainWorkerResponse*);

  absl::Status KeyValueSet(const v1::KeyValueSetRequest& request, v1::KeyValueSetResponse*);
  absl::Status KeyValueTryGet(const v1::KeyValueGetRequest& request,
                              v1::KeyValueGetResponse* response);
  absl::Status KeyValueList(const v1::KeyValueListRequest& request,
                            v1::KeyValueListResponse* response);
  absl::Status KeyValueDelete(const v1::KeyValueDeleteRequest& request,
                              v1::KeyValueDeleteResponse*);
  // Waiting calls answer through `done`, on another thread, without holding a server thread.
  // Timeouts are capped at kMaxWait so a forgotten waiter cannot live forever.
  void KeyValueGet(const v1::KeyValueGetRequest& request,
                   std::function<void(absl::StatusOr<std::string>)> done);
  void WaitAtBarrier(const v1::WaitAtBarrierRequest& request,
                     std::function<void(absl::Status)> done);
  static constexpr absl::Duration kMaxWait = absl::Minutes(30);

 private:
  coordinator::WorkerRegistry* const registry_;
  coordinator::KeyValueStore* const kv_;
  coordinator::JobTable* const jobs_;
  JobLauncher* const launcher_;
  CoordinatorTelemetry* const telemetry_;
  const JobMembership membership_{registry_, jobs_};
  std::atomic<bool> draining_{false};
  SubmitAdmission* admission_ = nullptr;  // limits: rate, paths, program store; may be null
};

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
    uint64_t cache_max_bytes = uint64_t{16} << 30;
    absl::Duration telemetry_grace = absl::Seconds(5);  // wait for hosts before "partial"
    // HTTP (Prometheus /metrics, the web dashboard and its JSON/SSE API); empty: no HTTP port.
    std::string http_listen;
    std::string web_root;  // the dashboard's built assets (index.html); empty: API only
    // Automatic recovery: how long a restarted job waits for enough healthy hosts.
    absl::Duration restart_wait = absl::Seconds(60);
    // A running job none of whose hosts completed a step for this long is failed, naming the
    // host that stopped first (docs/liveness.md); zero: off.
    absl::Duration hang_timeout = absl::ZeroDuration();
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
  class UploadReactor;
  CoordinatorServer() = default;
  void SweepLiveness();
  // Once the workers had time to come back after a restart: fails each job restored RUNNING
  // whose workers did not re-register, naming them.
  void CheckRestoredJobs();
  // limits: --history_retention, and finished jobs past --job_retention/--max_finished_jobs.
  void PruneFinished();     // sweeper only: every minute, or sooner past --max_finished_jobs
  absl::Time pruned_at_;    // sweeper only
  CoordinatorLimits limits_;

  std::unique_ptr<coordinator::WorkerRegistry> registry_;
  std::unique_ptr<coordinator::KeyValueStore> kv_;
  std::unique_ptr<coordinator::JobTable> jobs_;
  std::unique_ptr<coordinator::ExecutableCache> cache_;
  std::unique_ptr<runtime::Runtime> runtime_;
  std::unique_ptr<CoordinatorTelemetry> telemetry_;
  std::unique_ptr<coordinator::ProgressMonitor> progress_;  // outlives launcher_
  std::unique_ptr<SubmitAdmission> admission_;  // outlives launcher_ and handler_
  std::unique_ptr<JobLauncher> launcher_;
  std::unique_ptr<CoordinatorRpcHandler> handler_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
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
