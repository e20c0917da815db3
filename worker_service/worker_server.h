// The worker process's service: the Worker gRPC service (with health and reflection) plus the
// loop that registers this host with the coordinator and heartbeats every timeout/2. Used by
// meshrun-worker and by tests.
//
// The loop never gives up: while the coordinator is unreachable it retries with backoff;
// when the coordinator forgot this worker (restart) it registers again; when it declared this
// incarnation dead it registers as a fresh incarnation (a new member, never merged back).
//
// Lifetime: Start() returns a running server; Drain() (or the destructor) deregisters and stops.
// Thread-safety: all public methods may be called from any thread; Drain() is idempotent.
#pragma once

#include <algorithm>
#include <atomic>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "common/background_tasks.h"
#include "common/idle_watchdog.h"
#include "common/path_roots.h"
#include "worker_service/heartbeat_sender.h"
#include "worker_service/telemetry_relay.h"
#include "worker_service/telemetry_uploader.h"
#include "worker/checkpointing.h"
#include "worker/executable_store.h"
#include "worker/host_identity.h"
#include "worker/memory_checkpoints.h"
#include "worker/metrics.h"
#include "runtime/kv_client.h"
#include "runtime/runtime.h"
#include "worker/sparse/plan_cache.h"
#include "worker/step_loop.h"

namespace meshrun::services {

class WorkerServer {
 public:
  struct Config {
    std::string listen = "[::]:7071";
    // host:port the coordinator should use to reach this worker; empty = listen host (or the
    // host name when listening on a wildcard address) with the bound port.
    std::string advertise_address;
    std::string coordinator = "127.0.0.1:7070";
    worker::HostIdentity identity;  // resolved (see worker/host_identity.h)
    std::string state_dir;          // required; created if missing (executables live here)
    std::string pjrt_plugin;        // the PJRT plugin to run with; empty: no runtime
    int64_t cpu_devices = 8;        // CPU plugin only
    absl::Duration rpc_timeout = absl::Seconds(5);
    // limits (docs/limits.md): an executable upload silent this long is cancelled; the
    // executable store's byte cap (least recently used go first).
    absl::Duration upload_idle_timeout = absl::Seconds(60);
    int64_t executable_store_bytes = worker::ExecutableStore::Limits().max_bytes;
    // Called (on a server thread) when the coordinator relays an admin's drain request
    // (Worker.Drain); it must return at once and start what SIGTERM starts. Empty: such
    // requests get FAILED_PRECONDITION.
    std::function<void()> on_drain_request;
    // Comma-separated directories, besides state_dir, where a job's data may lie (example
    // bundle, token shards, array file, checkpoints): --data_root. A job naming a path
    // elsewhere is refused at StartJob.
    std::string data_roots;
    // checkpoint (docs/checkpoints.md): register as a hot spare (--spare); the host memory
    // in-memory checkpoints may fill, in bytes (--memory_checkpoint_bytes; 0: MemAvailable at
    // start), which the coordinator checks a job's checkpoints against.
    bool spare = false;
    int64_t memory_checkpoint_bytes = 0;
  };

  // Errors: INVALID_ARGUMENT (bad address flag, a --data_root that is not an absolute
  // directory), FAILED_PRECONDITION (state directory
  // unusable), UNAVAILABLE (cannot listen); each names the flag; the runtime's error when
  // the plugin cannot be loaded. The coordinator being down is not an error: registration
  // keeps retrying in the background.
  static absl::StatusOr<std::unique_ptr<WorkerServer>> Start(Config config);
  ~WorkerServer();

  int port() const { return port_; }
  std::string incarnation() const;
  bool registered() const { return registered_; }

  // Stops heartbeating, cancels a running job between steps (one with checkpoints first saves
  // the step the coordinator picks for all its hosts: PreemptJob), deregisters (bounded by
  // rpc_timeout and the deadline), gives in-flight calls until `deadline`, then stops. The
  // destructor drains with a deadline of 1 s.
  void Drain(absl::Duration deadline);

 private:
  class Service;
  class LoadReactor;
  class CompileReactor;
  struct RunningJob {
    std::string job_id;
    int attempt = 0;  // JobManifest.attempts' size when it started: which run of the job
    std::shared_ptr<worker::CheckpointSaver> checkpoints;  // null: no policy; outlives the loop
    std::unique_ptr<worker::StepLoop> loop;
  };
  explicit WorkerServer(Config config);
  // Membership (worker_registration.cc): a random incarnation id, registering, heartbeats, and
  // the loop that keeps them going until Drain.
  static std::string FreshIncarnation();
  void RegistrationLoop();
  // How long until the next beat: the interval, ending on a heartbeat tick (HeartbeatTick).
  absl::Duration UntilNextBeat() const;
  absl::Status Register();
  absl::Status Heartbeat();
  absl::Status StartJob(const v1::StartJobRequest& request);
  // StartJob's steps (worker_job_start.cc).
  // The refusals before anything is loaded: ids, no runtime, a fenced incarnation, a path
  // outside --data_root. Errors: INVALID_ARGUMENT, FAILED_PRECONDITION.
  absl::Status CheckStartable(const v1::StartJobRequest& request);
  // Stops the earlier run of a restarted job and drops its unsent summaries. Errors:
  // FAILED_PRECONDITION (another job runs here), ALREADY_EXISTS (this attempt runs here).
  absl::Status StopEarlierRun(const std::string& job_id, int attempt);
  // The mode B hook that averages host replicas' accumulators over gloo between grad and
  // apply, reporting the all-reduce phase in heartbeats. Errors: INVALID_ARGUMENT (a bad
  // --advertise_address).
  absl::StatusOr<worker::StepLoop::GradientHook> GradientAverager(
      const v1::StartJobRequest& request, int replica_index, int replica_count,
      const v1::Program& apply_program);
  // Where the step loop's host summaries go: the uploader, stamped with this run.
  std::function<void(worker::HostStepSummary)> SummarySink(int attempt, bool replicated);
  // Makes `job` the running job and stops the finished one it replaces.
  void InstallRunningJob(std::unique_ptr<RunningJob> job);
  absl::Status StopJob(const v1::StopJobRequest& request);
  absl::Status CheckpointNow(const v1::CheckpointNowRequest& request);
  // Drain's preemption notice to the running job (see Drain).
  void PreemptRunningJob();
  // Waits (polling, bounded by `deadline`) until the running job's loop ended, if any.
  void WaitForJobEnd(absl::Duration deadline);
  // Compiles and serializes `request`'s program, keeping the executable in the local store.
  // Errors: FAILED_PRECONDITION (no runtime), INVALID_ARGUMENT (bad signature; compile errors).
  absl::StatusOr<std::string> CompileProgram(const v1::CompileProgramRequest& request);
  void FillStatus(v1::WorkerStatusReport* report);
  absl::Status DeviceMemory(const v1::WorkerDeviceMemoryRequest& request,
                            v1::WorkerDeviceMemoryResponse* response);
  // Sends a job's outcome to the coordinator (retrying while it is unreachable, bounded).
  void ReportOutcome(const std::string& job_id, int attempt, const worker::LoopResult& result);

  const Config config_;
  PathRoots data_roots_;  // state_dir plus config_.data_roots
  std::string advertise_address_;
  std::unique_ptr<v1::Coordinator::Stub> coordinator_;
  std::unique_ptr<HeartbeatSender> heartbeats_;  // on coordinator_; after it, so it ends first
  bool unary_heartbeats_ = false;  // the coordinator lacks StreamHeartbeats (RegistrationLoop's)
  // The coordinator's key-value store: the PJRT client's and host replicas' rendezvous.
  std::shared_ptr<runtime::KeyValueClient> kv_client_;
  std::unique_ptr<runtime::Runtime> runtime_;  // null without --pjrt_plugin
  std::unique_ptr<worker::ExecutableStore> executables_;
  std::unique_ptr<IdleWatchdog> idle_uploads_;  // outlives server_'s reactors
  worker::Metrics metrics_;
  worker::sparse::PlanCache plans_;  // one PlanBuilder per sparse-attention contract
  // The last job's in-memory checkpoints: kept across its runs (a restart restores them).
  worker::MemoryCheckpointStore memory_checkpoints_;
  std::unique_ptr<TelemetryUploader> uploader_;
  // Serves Worker.RelayTelemetry for the hosts this one relays for; after server_ is gone.
  std::unique_ptr<TelemetryRelay> relay_;
  absl::Mutex job_mu_;
  std::unique_ptr<RunningJob> job_ ABSL_GUARDED_BY(job_mu_);
  BackgroundTasks reporters_;  // outcome reports, retried while the coordinator is away
  // Calls that wait on disk, a compile or a job (StartJob, CompileProgram, an upload's
  // commit), off gRPC's callback threads; joined by Drain, before the server goes.
  BackgroundTasks slow_calls_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  mutable absl::Mutex mu_;
  std::string incarnation_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> registered_{false};
  std::atomic<int64_t> heartbeat_interval_millis_{1000};
  std::atomic<bool> in_allreduce_{false};  // the job waits in the cross-host gradient average
  std::atomic<double> allreduce_seconds_{0};  // the last gradient average's wait for peers
  absl::Notification stop_loop_;
  std::thread loop_;
  std::atomic<bool> drained_{false};
  // When a drain must be over (unix micros; max: not draining): outcome reports stop retrying
  // then, so a drain ends within its deadline even with the coordinator unreachable.
  std::atomic<int64_t> drain_until_micros_{std::numeric_limits<int64_t>::max()};
  absl::Duration DrainLeft() const {
    const int64_t until = drain_until_micros_.load();
    if (until == std::numeric_limits<int64_t>::max()) return absl::InfiniteDuration();
    return std::max(absl::ZeroDuration(), absl::FromUnixMicros(until) - absl::Now());
  }
};

}  // namespace meshrun::services
