// Drives each submitted job through its life on the coordinator:
//   PENDING:   pick the eligible workers (runtime pin), plan the SPMD mesh;
//   ASSIGNED:  compile every program once per cache key, or take it from the persistent
//              executable cache; with the coordinator's own runtime when it is the job's, for
//              the TPU slice the hosts form when its libtpu is theirs (target_compilers.h;
//              a program that cannot fit a chip fails the job, naming its bytes), else on
//              the job's first worker, which streams the executable back (and keeps it);
//   LOADING:   stream each executable in 1 MiB chunks to every worker of the job that does not
//              already hold it (all workers at once), then start the job on each worker;
//   RUNNING:   workers report progress; every worker SUCCEEDED -> SUCCEEDED; any failure, a
//              dead worker or a cancel ends the job for all of them.
// A TPU job spans every eligible host of its pin. The CPU PJRT plugin is single-process, so a
// CPU job runs on one free host, or, with mesh.host_replicas, data-parallel on several, each
// running the whole mesh (docs/multihost_cpu.md).
//
// Lifetime: the registry, job table, cache and runtime must outlive the launcher; the
// destructor waits for launches in progress (each bounded by its RPC deadlines).
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/background_tasks.h"
#include "coordinator/checkpoint_commits.h"
#include "coordinator/executable_cache.h"
#include "coordinator/job_table.h"
#include "coordinator/mesh_planner.h"
#include "coordinator/program_store.h"
#include "coordinator/progress_monitor.h"
#include "coordinator/worker_registry.h"
#include "meshrun/v1/coordinator.pb.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "coordinator/coordinator_telemetry.h"
#include "coordinator_service/target_compilers.h"
#include "coordinator_service/worker_channels.h"
#include "runtime/runtime.h"

namespace meshrun::services {

class JobLauncher {
 public:
  struct Config {
    coordinator::WorkerRegistry* registry = nullptr;
    coordinator::JobTable* jobs = nullptr;
    coordinator::ExecutableCache* cache = nullptr;
    runtime::Runtime* runtime = nullptr;  // compiles; null: this coordinator cannot compile
    // Compiles TPU jobs for the slice their hosts form (--tpu_compiler_plugin); may be null.
    TargetCompilers* target_compilers = nullptr;
    CoordinatorTelemetry* telemetry = nullptr;  // collects the jobs' summaries; may be null
    coordinator::ProgressMonitor* progress = nullptr;  // hang detection; may be null
    absl::Duration rpc_timeout = absl::Seconds(60);
    size_t chunk_bytes = 1 << 20;         // executable transfer chunk, at most 1 MiB
    absl::Duration restart_wait = absl::Seconds(60);  // a restart waits this long for hosts
    // Where the jobs' program bytes are (their specs hold only sha256s); null: in the specs.
    coordinator::ProgramStore* programs = nullptr;
    // A job of more hosts than this has its telemetry relayed in groups of this many
    // (docs/scale.md, "Telemetry relays"); 0: every host uploads its own.
    int telemetry_relay_hosts = 64;
  };

  explicit JobLauncher(Config config);
  ~JobLauncher();

  // The channels to the workers, which the coordinator's other calls to them share.
  WorkerChannels& channels() { return channels_; }

  // A worker's progress, from its heartbeat, for hang detection (Config::progress).
  void ReportProgress(const std::string& host, const std::string& job_id, int64_t step,
                      const std::string& phase);
  // Fails every job Config::progress finds hung, naming the host that stopped first.
  void FailHungJobs();
  // Config::progress's hang timeout; zero when hang detection is off.
  absl::Duration hang_timeout() const {
    return config_.progress != nullptr ? config_.progress->hang_timeout() : absl::ZeroDuration();
  }

  // Starts launching a PENDING job in the background.
  // `attempts`: the job's attempts when this run was decided; a launch that finds the job
  // restarted again by then does nothing.
  void Launch(const std::string& job_id, int attempts = 0);

  // Cancels the job and tells each of its workers to stop (bounded by rpc_timeout).
  // Errors: as JobTable::Cancel.
  absl::Status Cancel(const std::string& job_id);

  // A worker's progress report. Errors: INVALID_ARGUMENT (state not RUNNING, SUCCEEDED,
  // FAILED or CANCELLED), NOT_FOUND (job), FAILED_PRECONDITION (the incarnation is not one
  // of the job's, or the job already ended).
  absl::Status Report(const v1::ReportJobProgressRequest& report);

  // Fails the unfinished jobs of a worker that was declared dead, naming it, and stops the
  // job's other workers.
  void OnWorkerDead(const coordinator::WorkerEntry& dead);

  // A host's checkpoint report (coordinator::CheckpointCommits::Report, same errors).
  absl::Status ReportCheckpoint(const v1::ReportCheckpointRequest& report) {
    return commits_.Report(report);
  }
  // Asks every host of a running job to checkpoint the same step, one all can still reach
  // (two past the furthest host's), and returns it (0 for a one-host job: after its current
  // step); `then_stop`: each stops after it (a preemption). Each host is asked within 5 s.
  // Errors: NOT_FOUND, FAILED_PRECONDITION (not running; no checkpoint policy), UNAVAILABLE
  // (a host did not answer or take it, named).
  absl::StatusOr<int64_t> CheckpointNow(const std::string& job_id, bool then_stop = false);
  // A host's preemption notice (PreemptJob): CheckpointNow with then_stop, and the run's end
  // is then blamed on that host. Errors: as CheckpointNow; INVALID_ARGUMENT; FAILED_PRECONDITION
  // (the incarnation or run is not the job's).
  absl::StatusOr<int64_t> Preempt(const v1::PreemptJobRequest& request);

  // Fails an unfinished job naming `host` and `error`, stops its workers and ends its
  // telemetry; unless the job can restart (docs/checkpoints.md: a checkpoint policy, a
  // committed checkpoint, restarts left), which it then does. Errors: as JobTable::Fail.
  // `host_at_fault` false: the host only reported the failure (its checkpoint did not restore),
  // so a restart may use it again. `may_restart` false: the job fails even if it could restart.
  absl::Status Fail(const std::string& job_id, const std::string& host, const std::string& error,
                    bool host_at_fault = true, bool may_restart = true);

 private:
  absl::Status RunLaunch(const std::string& job_id, int attempts);
  struct Assignment {
    coordinator::MeshPlan plan;
    std::vector<coordinator::WorkerInfo> hosts;  // in plan.hosts order
  };
  // PENDING -> ASSIGNED's choice: the runtime pin, the hosts and the mesh, from the workers
  // alive now. Errors: FAILED_PRECONDITION (no eligible worker, no mesh fits; named).
  absl::StatusOr<Assignment> Plan(const v1::JobManifest& job);
  // RunLaunch's steps, one per state it moves the job to.
  // PENDING -> ASSIGNED: plans and books hosts (a restarted job waits up to restart_wait for
  // them), checks the shardings fit the mesh. Null when there is nothing more to do: the job
  // restarted or ended meanwhile, or a restart gave up. Errors: the planner's, the table's.
  absl::StatusOr<std::optional<Assignment>> AssignHosts(const std::string& job_id, int attempts);
  struct CompiledPrograms {
    std::map<std::string, coordinator::CachedExecutable> executables;  // by fingerprint
    std::set<std::string> compiled_by_worker;  // fingerprints the compiling worker holds
  };
  // ASSIGNED -> LOADING: each program compiled once per cache key, here when this coordinator
  // runs the job's runtime, else on the job's first worker; the outcome in the manifest.
  // Errors: the program store's, the compiler's, the table's.
  absl::StatusOr<CompiledPrograms> CompilePrograms(const std::string& job_id, int attempts,
                                                   const v1::JobSpec& spec,
                                                   const Assignment& assigned);
  // Sends every host what it lacks, all at once; the bytes sent in the manifest. Errors: the
  // first failed host's transfer, named (and recorded as the failed host).
  absl::Status DistributeExecutables(const std::string& job_id, const Assignment& assigned,
                                     const CompiledPrograms& compiled);
  // LOADING -> RUNNING: telemetry and progress tracking first, then StartJob on every worker.
  // Errors: the first worker's refusal, named; the table's.
  absl::Status StartWorkers(const std::string& job_id, int attempts, const Assignment& assigned);
  // Records the plan's mesh and hosts in the job's manifest (the booking Plan reads).
  absl::Status Book(const std::string& job_id, const v1::JobSpec& spec,
                    const Assignment& assigned) ABSL_EXCLUSIVE_LOCKS_REQUIRED(booking_mu_);
  // Sends `host` every executable it does not hold (one retry after a corrupt transfer) and
  // records what it now holds; returns the bytes sent. Errors: the transfer's.
  absl::StatusOr<int64_t> Distribute(
      const std::string& job_id, const coordinator::WorkerInfo& host,
      const std::map<std::string, coordinator::CachedExecutable>& executables,
      const std::set<std::string>& held);
  // Compiles `program` on `host` and receives the serialized executable, verified.
  // Errors: the worker's; DATA_LOSS (truncated or corrupt transfer).
  // The compiler's statistics of the executable under cache `key`: stats[role], when this
  // compile made them, is remembered; a cache hit gets what an earlier compile of this
  // coordinator remembered (none after a restart). At most kRememberedStats keys are kept.
  void RememberStats(const std::string& key, const std::string& role,
                     std::map<std::string, runtime::ExecutableStats>& stats);
  static constexpr size_t kRememberedStats = 4096;
  absl::StatusOr<std::string> CompileOnWorker(const coordinator::WorkerInfo& host,
                                              const v1::Program& program,
                                              const std::string& compile_options);
  // Asks every live worker of `job` to stop it, all at once, each within 5 s; logs failures.
  void StopWorkers(const v1::JobManifest& job);
  // The job's hosts that are alive as the incarnation the job runs on, in registry order.
  std::vector<coordinator::WorkerInfo> LiveMembers(const v1::JobManifest& job);
  // The first of the job's workers other than `except` that does not answer (1 s) as the
  // incarnation the job runs on; "" when all do.
  std::string UnreachableHost(const v1::JobManifest& job, const std::string& except);
  // Restarts a job with a checkpoint policy may make when its JobSpec does not say.
  static constexpr int kDefaultMaxRestarts = 3;
  // Records on the checkpoint that `job` (the manifest as the failed run saw it) restored that
  // restoring it failed (CheckpointRecord.restore_error), so that recovery falls back to an
  // older one.
  void MarkUnrestorable(const v1::JobManifest& job, const std::string& error);
  // Automatic recovery: when `job_id` can restart, stops its workers, makes it PENDING from its
  // newest checkpoint (in memory when the surviving hosts hold one at least as new as the
  // newest committed one) and launches it again; returns whether it did.
  bool MaybeRestart(const std::string& job_id, const std::string& host,
                    const std::string& cause, bool host_at_fault = true);
  // The newest in-memory checkpoint in [at_least, at_most] that the hosts of `job`'s run, less
  // `lost` ("" for none), still hold for every mesh position (asked at once, 1 s each).
  std::optional<v1::MemoryRestore> NewestMemoryCheckpoint(const v1::JobManifest& job,
                                                          const std::string& lost,
                                                          int64_t at_least, int64_t at_most);
  // A restarted run found no hosts within restart_wait (`why`, the planner's answer): fails the
  // job naming the previous run's cause and host, and the checkpoint to resume from.
  void GiveUpRestart(const v1::JobManifest& job, const absl::Status& why);
  // Called once a job reached a final state: its telemetry ends after what is pending, its
  // uncommitted checkpoints are discarded.
  void Finished(const std::string& job_id);
  // `reconnect_wait`: how long a call waits for a failing channel to connect again (a worker
  // restarted at the same address). gRPC keeps such a channel failing until a connection
  // succeeds, so to a dead host the whole wait is spent: calls on a restart's path wait less.
  static constexpr absl::Duration kLaunchReconnectWait = absl::Seconds(3);
  static constexpr absl::Duration kProbeReconnectWait = absl::Milliseconds(500);
  WorkerChannels::Worker WorkerStub(const coordinator::WorkerInfo& worker,
                                    absl::Duration reconnect_wait = kLaunchReconnectWait) {
    return channels_.At(worker.host, worker.address, reconnect_wait);
  }

  const Config config_;
  WorkerChannels channels_;  // before launches_: a launch in flight uses it
  BackgroundTasks launches_;
  // Held from a launch's Plan until its hosts are booked in the job table, so concurrent
  // launches never book the same host twice (taken before mu_, never while waiting).
  absl::Mutex booking_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  absl::Mutex mu_;
  std::map<std::string, std::set<std::string>> succeeded_hosts_ ABSL_GUARDED_BY(mu_);
  coordinator::CheckpointCommits commits_{config_.jobs};
  // Restarting jobs: the host incarnation whose failure restarted each, which its next run
  // must not be planned onto (it may still look alive until its heartbeat times out).
  std::map<std::string, std::pair<std::string, std::string>> failed_member_
      ABSL_GUARDED_BY(mu_);
  // Jobs whose restore from an in-memory checkpoint failed: that step and older are not tried
  // again (the next restart reads the disk tier).
  std::map<std::string, int64_t> memory_refused_ ABSL_GUARDED_BY(mu_);
  // Preempted jobs: the run (attempts' size) and the host whose SIGTERM stopped it.
  std::map<std::string, std::pair<int, std::string>> preempted_ ABSL_GUARDED_BY(mu_);
  absl::Mutex stats_mu_;
  std::map<std::string, runtime::ExecutableStats> stats_by_key_ ABSL_GUARDED_BY(stats_mu_);
};

}  // namespace meshrun::services
