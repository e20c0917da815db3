#include "coordinator_service/job_launcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "jobspec/job_validation.h"
#include "jobspec/memory_tier.h"
#include "coordinator/mesh_planner.h"
#include "coordinator/start_job_manifest.h"
#include "jobspec/spec_limits.h"
#include "rpc/channel_health.h"
#include "coordinator_service/registry_proto.h"
#include "rpc/proto_convert.h"
#include "rpc/server_support.h"

namespace meshrun::services {
using coordinator::WorkerEntry;
using coordinator::WorkerInfo;


JobLauncher::JobLauncher(Config config) : config_(config) {}

JobLauncher::~JobLauncher() { launches_.JoinAll(); }

void JobLauncher::Launch(const std::string& job_id, int attempts) {
  launches_.Run([this, job_id, attempts] {
    absl::Status status = RunLaunch(job_id, attempts);
    if (!status.ok()) {
      absl::StatusOr<v1::JobManifest> job = config_.jobs->Get(job_id);
      if (job.ok() && job->attempts_size() != attempts) {
        // A worker of this run failed (its restore, say) while it was being launched, and the
        // job restarted: this launch is over, the next run's is under way.
        spdlog::info("job {}: launch of run {} abandoned: {}", job_id, attempts + 1,
                     status.ToString());
        return;
      }
      Fail(job_id, job.ok() ? job->failed_host() : "", std::string(status.message()))
          .IgnoreError();  // the job already ended (cancelled meanwhile)
    }
  });
}

absl::StatusOr<JobLauncher::Assignment> JobLauncher::Plan(const v1::JobManifest& job) {
  const std::string& job_id = job.job_id();
  const v1::JobSpec& spec = job.spec();
  // PENDING -> ASSIGNED: pin, choose hosts, plan the mesh.
  std::pair<std::string, std::string> failed;  // host, incarnation
  {
    absl::MutexLock lock(&mu_);
    if (auto it = failed_member_.find(job_id); it != failed_member_.end()) failed = it->second;
  }
  // Spares (--spare) wait for a restart: a job's first run leaves them out.
  const bool restart = job.attempts_size() > 0;
  std::vector<WorkerInfo> alive;
  std::vector<std::string> spares_kept;
  for (const WorkerEntry& entry : config_.registry->List()) {
    if (entry.state != coordinator::WorkerState::kAlive ||
        std::pair(entry.info.host, entry.info.incarnation) == failed) {
      continue;
    }
    if (entry.info.spare && !restart) {
      spares_kept.push_back(entry.info.host);
    } else {
      alive.push_back(entry.info);
    }
  }
  coordinator::PinResult pinned = coordinator::PinRuntime(alive, FromProto(spec.runtime_pin()));
  if (pinned.eligible.empty()) {
    std::vector<std::string> reasons;
    for (const auto& e : pinned.excluded) reasons.push_back(e.host + ": " + e.reason);
    for (const std::string& host : spares_kept) {
      reasons.push_back(host + ": a spare (--spare), kept for restarts");
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "no eligible worker for this job", reasons.empty() ? " (none registered)" : ": ",
        absl::StrJoin(reasons, "; ")));
  }
  std::set<std::string> busy;
  for (const v1::JobManifest& other : config_.jobs->List()) {
    if (other.job_id() == job_id || jobspec::IsFinal(other.state())) continue;
    for (const auto& [host, incarnation] : other.host_incarnations()) busy.insert(host);
  }
  // A TPU job spans every eligible host with one SPMD program; a CPU job takes its free hosts
  // (one, or one per host replica: the CPU client sees only its own process's devices).
  const coordinator::MeshRequest request{.dp = spec.mesh().data_parallel(),
                                         .ep = spec.mesh().expert_parallel(),
                                         .tp = spec.mesh().tensor_parallel()};
  const int replicas = std::max(1, spec.mesh().host_replicas());
  if (replicas > 1 && pinned.pin.platform_name != "cpu") {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh.host_replicas is ", replicas, " but the job runs on ", pinned.pin.platform_name,
        ", where one SPMD program spans the hosts; leave it 0"));
  }
  absl::StatusOr<coordinator::MeshPlan> planned =
      pinned.pin.platform_name == "cpu"
          ? coordinator::PlanCpuJob(request, replicas, pinned.eligible, busy)
          : coordinator::PlanMesh(request, pinned.eligible);
  if (!planned.ok() && !spares_kept.empty()) {
    return absl::Status(planned.status().code(),
                        absl::StrCat(planned.status().message(), " (spares, kept for restarts: ",
                                     absl::StrJoin(spares_kept, ", "), ")"));
  }
  Assignment out;
  coordinator::MeshPlan& plan = out.plan;
  ASSIGN_OR_RETURN(plan, std::move(planned));
  for (const std::string& name : plan.hosts) {
    for (const WorkerInfo& host : pinned.eligible) {
      if (host.host == name) out.hosts.push_back(host);
    }
  }
  return out;
}

namespace {
// The ended run's hosts this run does without, each paired (in order) with a host it took on.
void RecordReplacements(v1::JobManifest& job) {
  v1::JobAttempt& ended = *job.mutable_attempts(job.attempts_size() - 1);
  std::vector<std::string> gone, added;
  for (const std::string& host : ended.hosts()) {
    if (!job.host_incarnations().contains(host)) gone.push_back(host);
  }
  std::set<std::string> kept(ended.hosts().begin(), ended.hosts().end());
  for (const auto& [host, incarnation] : job.host_incarnations()) {
    if (!kept.contains(host)) added.push_back(host);
  }
  ended.clear_replaced_hosts();
  for (size_t i = 0; i < gone.size() && i < added.size(); ++i) {
    (*ended.mutable_replaced_hosts())[gone[i]] = added[i];
  }
}
}  // namespace

absl::Status JobLauncher::Book(const std::string& job_id, const v1::JobSpec& spec,
                               const Assignment& assigned) {
  const coordinator::MeshPlan& plan = assigned.plan;
  return config_.jobs->Update(job_id, [&](v1::JobManifest& m) {
    v1::MeshAssignment* mesh = m.mutable_mesh();
    for (const std::string& axis : plan.axis_names) mesh->add_axis_names(axis);
    for (int64_t size : plan.shape) mesh->add_shape(static_cast<int32_t>(size));
    for (int32_t id : plan.device_ids) mesh->add_device_ids(id);
    for (const std::string& host : plan.device_hosts) mesh->add_device_hosts(host);
    for (const std::string& host : plan.replica_hosts) mesh->add_replica_hosts(host);
    if (plan.num_slices > 1) SetMultislice(plan, *mesh);
    *m.mutable_runtime() = ToProto(plan.runtime);
    for (const WorkerInfo& host : assigned.hosts) {
      (*m.mutable_host_incarnations())[host.host] = host.incarnation;
      (*m.mutable_host_runtime_versions())[host.host] = runtime::ToString(host.runtime);
    }
    if (m.attempts_size() > 0) RecordReplacements(m);
    m.set_compile_mode(jobspec::CompileMode(spec));
  });
}

absl::StatusOr<std::optional<JobLauncher::Assignment>> JobLauncher::AssignHosts(
    const std::string& job_id, int attempts) {
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(job_id));
  if (job.attempts_size() != attempts) return std::nullopt;  // restarted again since
  // A restarted job waits for enough healthy hosts (the same host back, or a spare).
  const absl::Time give_up = absl::Now() + (job.attempts_size() > 0 ? config_.restart_wait
                                                                      : absl::ZeroDuration());
  absl::StatusOr<Assignment> assigned;
  absl::Status booked;
  for (;;) {
    {
      // Plan and book atomically: a concurrent launch sees these hosts busy.
      absl::MutexLock booking(&booking_mu_);
      assigned = Plan(job);
      if (assigned.ok()) booked = Book(job_id, job.spec(), *assigned);
    }
    if (assigned.ok() || !absl::IsFailedPrecondition(assigned.status()) ||
        absl::Now() >= give_up) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(500));
    ASSIGN_OR_RETURN(job, config_.jobs->Get(job_id));
    if (jobspec::IsFinal(job.state())) return std::nullopt;  // cancelled meanwhile
  }
  if (!assigned.ok() && attempts > 0 && absl::IsFailedPrecondition(assigned.status())) {
    GiveUpRestart(job, assigned.status());  // no more restarts: waiting again would not help
    return std::nullopt;
  }
  RETURN_IF_ERROR(assigned.status());
  RETURN_IF_ERROR(booked);
  const coordinator::MeshPlan& plan = assigned->plan;
  // limits: a declared sharding the planned mesh cannot give fails the job here, named.
  RETURN_IF_ERROR(jobspec::CheckShardingFitsMesh(job.spec(), plan.axis_names, plan.shape));
  // limits: each host must hold the job's in-memory checkpoints (and its ring peer's).
  ASSIGN_OR_RETURN(const v1::JobManifest booked_job, config_.jobs->Get(job_id));
  for (const WorkerInfo& host : assigned->hosts) {
    RETURN_IF_ERROR(jobspec::CheckMemoryTierFits(booked_job.spec(), booked_job.mesh(), host.host,
                                                 host.host_memory_bytes));
  }
  RETURN_IF_ERROR(config_.jobs->Transition(job_id, v1::JOB_STATE_ASSIGNED, attempts));
  spdlog::info("job {} ASSIGNED: {}", job_id, plan.ToString());
  return std::move(*assigned);
}

absl::Status JobLauncher::StartWorkers(const std::string& job_id, int attempts,
                                       const Assignment& assigned) {
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(job_id));
  if (job.attempts_size() != attempts) return absl::OkStatus();  // restarted meanwhile
  if (jobspec::IsFinal(job.state())) return absl::OkStatus();  // cancelled while loading
  // Who relays whose telemetry, recorded before any worker starts uploading through a relay.
  std::vector<std::string> hosts;
  for (const WorkerInfo& host : assigned.hosts) hosts.push_back(host.host);
  std::map<std::string, std::string> relay_of;
  if (config_.telemetry != nullptr && !job.spec().telemetry().empty()) {
    relay_of = coordinator::AssignTelemetryRelays(hosts, config_.telemetry_relay_hosts);
  }
  if (!relay_of.empty() || !job.telemetry_relays().empty()) {
    RETURN_IF_ERROR(config_.jobs->Update(job_id, [&](v1::JobManifest& m) {
      m.mutable_telemetry_relays()->clear();
      m.mutable_telemetry_relays()->insert(relay_of.begin(), relay_of.end());
    }));
  }
  // Telemetry is collected before any worker starts.
  if (config_.telemetry != nullptr && !job.spec().telemetry().empty()) {
    RETURN_IF_ERROR(job.attempts_size() > 0 ? config_.telemetry->RestartJob(job)
                                            : config_.telemetry->StartJob(job));
  }
  if (config_.progress != nullptr) config_.progress->StartJob(job_id, hosts);
  const int64_t hang_timeout_millis =
      config_.progress != nullptr ? absl::ToInt64Milliseconds(config_.progress->hang_timeout())
                                  : 0;
  // Each host gets the job's shared parts and its own entries (coordinator/start_job_manifest.h)
  // and, for a program spanning hosts, where its ring predecessor serves, to copy its
  // in-memory checkpoints.
  const coordinator::StartJobManifests manifests(job);
  std::map<std::string, std::string> address_of;
  for (const WorkerInfo& host : assigned.hosts) address_of[host.host] = host.address;
  // Every host at once (bounded): the launch costs the slowest StartJob, not their sum.
  std::vector<absl::Status> started(assigned.hosts.size());
  RunConcurrently(assigned.hosts.size(), [&](size_t i) {
    const std::string& host = assigned.hosts[i].host;
    v1::StartJobRequest request;
    request.set_job_id(job_id);
    *request.mutable_manifest() = manifests.ForHost(host);
    request.set_hang_timeout_millis(hang_timeout_millis);
    if (auto peer = address_of.find(manifests.RingPredecessorOf(host));
        peer != address_of.end()) {
      request.set_ring_peer_address(peer->second);
    }
    if (auto relay = relay_of.find(host); relay != relay_of.end()) {
      request.set_telemetry_relay_host(relay->second);
      request.set_telemetry_relay_address(address_of.at(relay->second));
    }
    v1::StartJobResponse response;
    auto context = ContextWithTimeout(config_.rpc_timeout);
    started[i] =
        FromGrpcStatus(WorkerStub(assigned.hosts[i])->StartJob(context.get(), request, &response));
  });
  for (size_t i = 0; i < started.size(); ++i) {  // the first host, in mesh order, that failed
    if (started[i].ok()) continue;
    const std::string& host = assigned.hosts[i].host;
    config_.jobs->Update(job_id, [&](v1::JobManifest& m) { m.set_failed_host(host); })
        .IgnoreError();
    return absl::Status(started[i].code(), absl::StrCat("starting the job on worker ", host,
                                                        ": ", started[i].message()));
  }
  absl::Status running = config_.jobs->Transition(job_id, v1::JOB_STATE_RUNNING, attempts);
  // A worker may already have finished (tiny jobs) or the job was cancelled meanwhile: then
  // Cancel's stop may have reached the workers before they started, so stop them again.
  if (!running.ok()) {
    absl::StatusOr<v1::JobManifest> now = config_.jobs->Get(job_id);
    if (now.ok() && now->state() == v1::JOB_STATE_CANCELLED) StopWorkers(*now);
    if (now.ok() && jobspec::IsFinal(now->state())) return absl::OkStatus();
  }
  return running;
}

absl::Status JobLauncher::RunLaunch(const std::string& job_id, int attempts) {
  ASSIGN_OR_RETURN(std::optional<Assignment> assigned, AssignHosts(job_id, attempts));
  if (!assigned.has_value()) return absl::OkStatus();
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(job_id));
  ASSIGN_OR_RETURN(CompiledPrograms compiled,
                   CompilePrograms(job_id, attempts, job.spec(), *assigned));
  RETURN_IF_ERROR(DistributeExecutables(job_id, *assigned, compiled));
  return StartWorkers(job_id, attempts, *assigned);
}

absl::Status JobLauncher::Cancel(const std::string& job_id) {
  RETURN_IF_ERROR(config_.jobs->Cancel(job_id));
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(job_id));
  spdlog::info("job {} CANCELLED", job_id);
  // Stopping waits on the workers (5 s at worst): off the RPC's thread.
  launches_.Run([this, job = std::move(job)] {
    StopWorkers(job);
    Finished(job.job_id());
  });
  return absl::OkStatus();
}

std::vector<WorkerInfo> JobLauncher::LiveMembers(const v1::JobManifest& job) {
  std::vector<WorkerInfo> live;
  for (const WorkerEntry& entry : config_.registry->List()) {
    auto it = job.host_incarnations().find(entry.info.host);
    if (it != job.host_incarnations().end() && it->second == entry.info.incarnation &&
        entry.state == coordinator::WorkerState::kAlive) {
      live.push_back(entry.info);
    }
  }
  return live;
}

void JobLauncher::StopWorkers(const v1::JobManifest& job) {
  const std::vector<WorkerInfo> running = LiveMembers(job);
  // Every host at once, so one hung worker costs the stop its 5 s deadline, not 5 s per host.
  RunConcurrently(running.size(), [&](size_t i) {
    v1::StopJobRequest request;
    request.set_job_id(job.job_id());
    v1::StopJobResponse response;
    auto context = ContextWithTimeout(absl::Seconds(5));
    // No wait for a failing channel: its host is most likely the one lost (gRPC keeps the
    // channel failing until a connection succeeds, so the wait would run out), and a live host
    // missed here is stopped by the next run's StartJob (WorkerServer::StopEarlierRun).
    grpc::Status status =
        WorkerStub(running[i], absl::ZeroDuration())->StopJob(context.get(), request, &response);
    if (!status.ok() && status.error_code() != grpc::StatusCode::NOT_FOUND) {
      spdlog::warn("stopping job {} on {}: {}", job.job_id(), running[i].host,
                   status.error_message());
    }
  });
}

absl::Status JobLauncher::Report(const v1::ReportJobProgressRequest& report) {
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(report.job_id()));
  RETURN_IF_ERROR(coordinator::CheckJobMember(job, report.host(), report.incarnation()));
  if (jobspec::IsFinal(job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", report.job_id(), " already ended ", jobspec::JobStateName(job.state())));
  }
  if (report.attempt() != job.attempts_size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the report is from run ", int64_t{report.attempt()} + 1, " of job ", report.job_id(),
        ", which restarted since (now run ", job.attempts_size() + 1, ")"));
  }
  RETURN_IF_ERROR(config_.jobs->Update(report.job_id(), [&](v1::JobManifest& m) {
    m.set_last_step(std::max(m.last_step(), report.last_step()));
  }));
  switch (report.state()) {
    case v1::JOB_STATE_RUNNING:
      return absl::OkStatus();
    case v1::JOB_STATE_FAILED:
    case v1::JOB_STATE_CANCELLED:
      spdlog::info("job {} run {}: {} reports {}{}{}", report.job_id(), job.attempts_size() + 1,
                   report.host(), jobspec::JobStateName(report.state()),
                   report.error().empty() ? "" : ": ", report.error());
      // Probing the other hosts and stopping them waits on workers: off the RPC's thread.
      launches_.Run([this, report, job = std::move(job)] {
        // Another host's report of the same run may have restarted the job meanwhile.
        if (absl::StatusOr<v1::JobManifest> now = config_.jobs->Get(report.job_id());
            now.ok() && now->attempts_size() != job.attempts_size()) {
          return;
        }
        std::string host = report.host();
        std::string error =
            report.state() == v1::JOB_STATE_FAILED
                ? report.error()
                : "stopped by the worker (a preemption: SIGTERM or shutdown)";
        if (report.state() == v1::JOB_STATE_CANCELLED) {
          // A preemption's hosts each report the checkpoint, then stop: the run must not end
          // (dropping its pending reports) before the last host's report completed the commit.
          for (int i = 0; i < 600 && commits_.Pending(report.job_id(), job.attempts_size()); ++i) {
            absl::SleepFor(absl::Milliseconds(50));
          }
          absl::MutexLock lock(&mu_);
          if (auto it = preempted_.find(report.job_id());
              it != preempted_.end() && it->second.first == job.attempts_size()) {
            host = it->second.second;
          }
        }
        bool host_at_fault = true;
        // A host that lost a peer (a cross-host all-reduce) reports first; blame the peer.
        if (const std::string gone = report.state() == v1::JOB_STATE_FAILED
                                         ? UnreachableHost(job, report.host())
                                         : "";
            !gone.empty()) {
          error = absl::StrCat("worker ", gone, " is unreachable; ", host, " reported: ", error);
          host = gone;
        } else if (report.restore_failed()) {  // the checkpoint's fault, not the host's
          if (job.memory_restore().step() > 0) {  // the next restart reads the disk tier
            absl::MutexLock lock(&mu_);
            memory_refused_[job.job_id()] = job.memory_restore().step();
          } else {
            MarkUnrestorable(job, error);
          }
          host_at_fault = false;
        }
        // A restart would compute the same values again: the job ends here.
        const bool may_restart = !report.nonfinite();
        // The probe takes time: the job may have restarted meanwhile.
        if (absl::StatusOr<v1::JobManifest> now = config_.jobs->Get(report.job_id());
            now.ok() && now->attempts_size() != job.attempts_size()) {
          return;
        }
        Fail(report.job_id(), host, error, host_at_fault && may_restart, may_restart)
            .IgnoreError();  // may have ended
      });
      return absl::OkStatus();
    case v1::JOB_STATE_SUCCEEDED: {
      bool all = false;
      {
        absl::MutexLock lock(&mu_);
        std::set<std::string>& done = succeeded_hosts_[report.job_id()];
        done.insert(report.host());
        all = done.size() == static_cast<size_t>(job.host_incarnations_size());
      }
      if (!all) return absl::OkStatus();
      if (config_.jobs->Get(report.job_id())->state() != v1::JOB_STATE_LOADING) {
        RETURN_IF_ERROR(config_.jobs->Transition(report.job_id(), v1::JOB_STATE_SUCCEEDED));
        spdlog::info("job {} SUCCEEDED at step {}", report.job_id(), report.last_step());
        Finished(report.job_id());
        return absl::OkStatus();
      }
      // The launch thread is still moving LOADING -> RUNNING: wait for it, off this thread.
      launches_.Run([this, report] {
        for (int i = 0; i < 100 && config_.jobs->Get(report.job_id())->state() ==
                                       v1::JOB_STATE_LOADING; ++i) {
          absl::SleepFor(absl::Milliseconds(10));
        }
        if (config_.jobs->Transition(report.job_id(), v1::JOB_STATE_SUCCEEDED).ok()) {
          spdlog::info("job {} SUCCEEDED at step {}", report.job_id(), report.last_step());
          Finished(report.job_id());
        }
      });
      return absl::OkStatus();
    }
    default:
      return absl::InvalidArgumentError(
          "state must be RUNNING, SUCCEEDED, FAILED or CANCELLED");
  }
}

void JobLauncher::OnWorkerDead(const WorkerEntry& dead) {
  const std::string error = absl::StrCat("worker ", dead.info.host, " (incarnation ",
                                         dead.info.incarnation, ") is DEAD: ", dead.state_reason);
  for (const v1::JobManifest& job : config_.jobs->List()) {
    auto it = job.host_incarnations().find(dead.info.host);
    if (!jobspec::IsFinal(job.state()) && it != job.host_incarnations().end() &&
        it->second == dead.info.incarnation) {
      MaybeRestart(job.job_id(), dead.info.host, error);
    }
  }
  for (const std::string& job_id :
       config_.jobs->FailJobsOnWorker(dead.info.host, dead.info.incarnation, error)) {
    spdlog::warn("job {} FAILED: {}", job_id, error);
    if (absl::StatusOr<v1::JobManifest> job = config_.jobs->Get(job_id); job.ok()) {
      StopWorkers(*job);
    }
    Finished(job_id);
  }
}

std::string JobLauncher::UnreachableHost(const v1::JobManifest& job, const std::string& except) {
  for (const WorkerEntry& entry : config_.registry->List()) {
    auto it = job.host_incarnations().find(entry.info.host);
    if (it == job.host_incarnations().end() || entry.info.host == except) continue;
    if (it->second != entry.info.incarnation) return entry.info.host;  // restarted since
    v1::GetStatusRequest request;
    v1::WorkerStatusReport status;
    auto context = ContextWithTimeout(absl::Seconds(1));
    if (!WorkerStub(entry.info, kProbeReconnectWait)->GetStatus(context.get(), request, &status)
             .ok() ||
        status.incarnation() != it->second) {
      return entry.info.host;
    }
  }
  return "";
}

absl::Status JobLauncher::Fail(const std::string& job_id, const std::string& host,
                               const std::string& error, bool host_at_fault, bool may_restart) {
  if (may_restart && MaybeRestart(job_id, host, error, host_at_fault)) return absl::OkStatus();
  RETURN_IF_ERROR(config_.jobs->Fail(job_id, host, error));
  spdlog::warn("job {} FAILED: {}", job_id, error);
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(job_id));
  StopWorkers(job);
  Finished(job_id);
  return absl::OkStatus();
}

void JobLauncher::ReportProgress(const std::string& host, const std::string& job_id,
                                 int64_t step, const std::string& phase) {
  if (config_.progress != nullptr) config_.progress->Report(host, job_id, step, phase);
}

void JobLauncher::FailHungJobs() {
  if (config_.progress == nullptr) return;
  for (const coordinator::ProgressMonitor::Hang& hang : config_.progress->Overdue()) {
    Fail(hang.job_id, hang.host, absl::StrCat("job hung: ", hang.error)).IgnoreError();
  }
}

void JobLauncher::Finished(const std::string& job_id) {
  commits_.Forget(job_id);
  if (config_.programs != nullptr) config_.programs->Release(job_id);
  if (config_.telemetry != nullptr) config_.telemetry->EndJob(job_id);
  if (config_.progress != nullptr) config_.progress->EndJob(job_id);
  absl::MutexLock lock(&mu_);
  succeeded_hosts_.erase(job_id);
  failed_member_.erase(job_id);
  memory_refused_.erase(job_id);
  preempted_.erase(job_id);
}

}  // namespace meshrun::services
