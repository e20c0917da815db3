#include "coordinator_service/job_launcher.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "jobspec/job_validation.h"
#include "coordinator/mesh_planner.h"
#include "jobspec/spec_limits.h"
#include "rpc/channel_health.h"
#include "coordinator_service/executable_transfer.h"
#include "coordinator_service/registry_proto.h"
#include "rpc/proto_convert.h"
#include "rpc/server_support.h"
#include "runtime/compile_options.h"

namespace meshrun::services {
using coordinator::WorkerEntry;
using coordinator::WorkerInfo;

namespace {
// What `host` holds now, by its own status (its store evicts: worker/executable_store.h); what
// it registered with when it does not answer within 5 s.
std::set<std::string> HeldBy(v1::Worker::Stub& stub, const WorkerInfo& host) {
  v1::WorkerStatusReport status;
  auto context = ContextWithTimeout(absl::Seconds(5));
  if (stub.GetStatus(context.get(), v1::GetStatusRequest(), &status).ok() &&
      status.incarnation() == host.incarnation) {
    return {status.executable_fingerprints().begin(), status.executable_fingerprints().end()};
  }
  return {host.executable_fingerprints.begin(), host.executable_fingerprints.end()};
}
}  // namespace

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

const JobLauncher::Peer& JobLauncher::PeerAt(const std::string& address) {
  // security: the worker at `address` must present the identity of the host registered there.
  std::string host;
  for (const WorkerEntry& entry : config_.registry->List()) {
    if (entry.info.address == address) host = entry.info.host;
  }
  Peer* peer;  // map nodes are stable, and a peer is never replaced
  {
    absl::MutexLock lock(&mu_);
    peer = &peers_[absl::StrCat(host, "@", address)];
    if (peer->channel == nullptr) {
      peer->channel = MakeWorkerChannel(address, host);
      peer->stub = v1::Worker::NewStub(peer->channel);
    }
  }
  // A worker restarted at this address: reach the new process, not the old channel's backoff.
  ReconnectIfFailing(*peer->channel, absl::Seconds(3));
  return *peer;
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
  std::vector<WorkerInfo> alive;
  for (const WorkerEntry& entry : config_.registry->List()) {
    if (entry.state == coordinator::WorkerState::kAlive &&
        std::pair(entry.info.host, entry.info.incarnation) != failed) {
      alive.push_back(entry.info);
    }
  }
  coordinator::PinResult pinned = coordinator::PinRuntime(alive, FromProto(spec.runtime_pin()));
  if (pinned.eligible.empty()) {
    std::vector<std::string> reasons;
    for (const auto& e : pinned.excluded) reasons.push_back(e.host + ": " + e.reason);
    return absl::FailedPreconditionError(absl::StrCat(
        "no eligible worker for this job", reasons.empty() ? " (none registered)" : ": ",
        absl::StrJoin(reasons, "; ")));
  }
  std::set<std::string> busy;
  for (const v1::JobManifest& other : config_.jobs->List()) {
    if (other.job_id() == job_id || coordinator::IsFinal(other.state())) continue;
    for (const auto& [host, incarnation] : other.host_incarnations()) busy.insert(host);
  }
  // A TPU job spans every eligible host with one SPMD program; a CPU job takes its free hosts
  // (one, or one per host replica: the CPU client sees only its own process's devices).
  const coordinator::MeshRequest request{.dp = spec.mesh().data_parallel(),
                                         .ep = spec.mesh().expert_parallel(),
                                         .tp = spec.mesh().tensor_parallel()};
  const int replicas = std::max(1, spec.mesh().host_replicas());
  Assignment out;
  coordinator::MeshPlan& plan = out.plan;
  if (pinned.pin.platform_name == "cpu") {
    ASSIGN_OR_RETURN(plan, coordinator::PlanCpuJob(request, replicas, pinned.eligible, busy));
  } else if (replicas > 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh.host_replicas is ", replicas, " but the job runs on ", pinned.pin.platform_name,
        ", where one SPMD program spans the hosts; leave it 0"));
  } else {
    ASSIGN_OR_RETURN(plan, coordinator::PlanMesh(request, pinned.eligible));
  }
  for (const std::string& name : plan.hosts) {
    for (const WorkerInfo& host : pinned.eligible) {
      if (host.host == name) out.hosts.push_back(host);
    }
  }
  return out;
}

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
    m.set_compile_mode(coordinator::CompileMode(spec));
  });
}

absl::Status JobLauncher::RunLaunch(const std::string& job_id, int attempts) {
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(job_id));
  if (job.attempts_size() != attempts) return absl::OkStatus();  // restarted again since
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
    if (coordinator::IsFinal(job.state())) return absl::OkStatus();  // cancelled meanwhile
  }
  if (!assigned.ok() && attempts > 0 && absl::IsFailedPrecondition(assigned.status())) {
    GiveUpRestart(job, assigned.status());  // no more restarts: waiting again would not help
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(assigned.status());
  RETURN_IF_ERROR(booked);
  const v1::JobSpec& spec = job.spec();
  const coordinator::MeshPlan& plan = assigned->plan;
  const std::vector<WorkerInfo>& hosts = assigned->hosts;
  // limits: a declared sharding the planned mesh cannot give fails the job here, named.
  RETURN_IF_ERROR(coordinator::CheckShardingFitsMesh(spec, plan.axis_names, plan.shape));
  RETURN_IF_ERROR(config_.jobs->Transition(job_id, v1::JOB_STATE_ASSIGNED, attempts));
  spdlog::info("job {} ASSIGNED: {}", job_id, plan.ToString());

  // ASSIGNED -> LOADING: compile once per key, here when this coordinator runs the job's
  // runtime, else on the job's first worker (which then already holds the executables).
  const bool compile_here = config_.runtime != nullptr && config_.runtime->identity() == plan.runtime;
  const WorkerInfo& compiler = hosts.front();
  std::vector<int64_t> device_ids(plan.device_ids.begin(), plan.device_ids.end());
  ASSIGN_OR_RETURN(std::string options,
                   runtime::BuildCompileOptions(runtime::SpmdCompileOptions(device_ids)));
  bool all_hits = true;
  absl::Duration compile_time;
  std::string compiled_on;
  std::map<std::string, coordinator::CachedExecutable> executables;  // by fingerprint
  std::map<std::string, std::string> fingerprints;                  // role -> fingerprint
  std::set<std::string> compiled_by_worker;                         // fingerprints
  for (const v1::Program& stored : spec.programs()) {
    ASSIGN_OR_RETURN(const v1::Program program,
                     config_.programs != nullptr ? config_.programs->Read(job_id, stored)
                                                 : absl::StatusOr<v1::Program>(stored));
    const std::string& program_options =
        program.compile_options().empty() ? options : program.compile_options();
    ASSIGN_OR_RETURN(runtime::ProgramSignature signature, SignatureOf(program));
    const std::string key = coordinator::CacheKey(program.stablehlo(), program_options,
                                                  plan.device_ids, plan.runtime);
    bool on_worker = false;
    ASSIGN_OR_RETURN(
        auto result,
        config_.cache->GetOrCompile(key, [&]() -> absl::StatusOr<std::string> {
          if (!compile_here) {
            on_worker = true;
            return CompileOnWorker(compiler, program, program_options);
          }
          ASSIGN_OR_RETURN(auto executable,
                           config_.runtime->Compile({.code = program.stablehlo(),
                                                     .format = "mlir",
                                                     .compile_options = program_options,
                                                     .signature = signature}));
          return config_.runtime->Serialize(*executable);
        }));
    if (result.outcome != coordinator::ExecutableCache::Outcome::kHit) {
      compiled_on = on_worker ? compiler.host : "coordinator";
    }
    if (on_worker) compiled_by_worker.insert(result.executable.sha256());
    all_hits = all_hits && result.outcome == coordinator::ExecutableCache::Outcome::kHit;
    compile_time += result.compile_time;
    fingerprints[program.role()] = result.executable.sha256();
    executables.emplace(result.executable.sha256(), result.executable);
    spdlog::info("job {} program {}: {} ({} bytes, compile {})", job_id, program.role(),
                 coordinator::ExecutableCache::OutcomeName(result.outcome),
                 result.executable.size(), absl::FormatDuration(result.compile_time));
  }
  RETURN_IF_ERROR(config_.jobs->Update(job_id, [&](v1::JobManifest& m) {
    m.set_cache_hit(all_hits);
    m.set_compile_seconds(absl::ToDoubleSeconds(compile_time));
    m.set_compiled_on(compiled_on);
    for (const auto& [role, fp] : fingerprints) (*m.mutable_program_fingerprints())[role] = fp;
  }));
  RETURN_IF_ERROR(config_.jobs->Transition(job_id, v1::JOB_STATE_LOADING, attempts));

  // Distribute to every worker at once, skipping what each already holds.
  std::vector<absl::StatusOr<int64_t>> sent(hosts.size(), int64_t{0});
  RunConcurrently(hosts.size(), [&](size_t i) {
    std::set<std::string> held = HeldBy(WorkerStub(hosts[i].address), hosts[i]);
    if (hosts[i].host == compiler.host) held.insert(compiled_by_worker.begin(), compiled_by_worker.end());
    sent[i] = Distribute(job_id, hosts[i], executables, held);
  });
  int64_t bytes_sent = 0;
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (!sent[i].ok()) {
      config_.jobs->Update(job_id, [&](v1::JobManifest& m) { m.set_failed_host(hosts[i].host); })
          .IgnoreError();
      return absl::Status(sent[i].status().code(),
                          absl::StrCat("loading executable on worker ", hosts[i].host, ": ",
                                       sent[i].status().message()));
    }
    bytes_sent += *sent[i];
  }
  RETURN_IF_ERROR(config_.jobs->Update(
      job_id, [&](v1::JobManifest& m) { m.set_executable_bytes_sent(bytes_sent); }));

  // LOADING -> RUNNING: collect telemetry first, then start every worker.
  ASSIGN_OR_RETURN(job, config_.jobs->Get(job_id));
  if (job.attempts_size() != attempts) return absl::OkStatus();  // restarted meanwhile
  if (coordinator::IsFinal(job.state())) return absl::OkStatus();  // cancelled while loading
  if (config_.telemetry != nullptr && !spec.telemetry().empty()) {
    RETURN_IF_ERROR(job.attempts_size() > 0 ? config_.telemetry->RestartJob(job)
                                            : config_.telemetry->StartJob(job));
  }
  if (config_.progress != nullptr) {
    std::vector<std::string> names;
    for (const WorkerInfo& host : hosts) names.push_back(host.host);
    config_.progress->StartJob(job_id, names);
  }
  for (const WorkerInfo& host : hosts) {
    v1::StartJobRequest request;
    request.set_job_id(job_id);
    *request.mutable_manifest() = job;
    if (config_.progress != nullptr) {
      request.set_hang_timeout_millis(
          absl::ToInt64Milliseconds(config_.progress->hang_timeout()));
    }
    v1::StartJobResponse response;
    auto context = ContextWithTimeout(config_.rpc_timeout);
    absl::Status started =
        FromGrpcStatus(WorkerStub(host.address).StartJob(context.get(), request, &response));
    if (!started.ok()) {
      config_.jobs->Update(job_id, [&](v1::JobManifest& m) { m.set_failed_host(host.host); })
          .IgnoreError();
      return absl::Status(started.code(), absl::StrCat("starting the job on worker ", host.host,
                                                       ": ", started.message()));
    }
  }
  absl::Status running = config_.jobs->Transition(job_id, v1::JOB_STATE_RUNNING, attempts);
  // A worker may already have finished (tiny jobs) or the job was cancelled meanwhile: then
  // Cancel's stop may have reached the workers before they started, so stop them again.
  if (!running.ok()) {
    absl::StatusOr<v1::JobManifest> now = config_.jobs->Get(job_id);
    if (now.ok() && now->state() == v1::JOB_STATE_CANCELLED) StopWorkers(*now);
    if (now.ok() && coordinator::IsFinal(now->state())) return absl::OkStatus();
  }
  return running;
}

absl::StatusOr<int64_t> JobLauncher::Distribute(
    const std::string& job_id, const WorkerInfo& host,
    const std::map<std::string, coordinator::CachedExecutable>& executables,
    const std::set<std::string>& held) {
  int64_t bytes_sent = 0;
  for (const auto& [fingerprint, executable] : executables) {
    if (!held.contains(fingerprint)) {
      const TransferOptions options{.chunk_bytes = config_.chunk_bytes,
                                    .base_timeout = config_.rpc_timeout};
      absl::Status sent = SendExecutable(PeerAt(host.address).channel, executable, options);
      if (absl::IsDataLoss(sent)) {  // corrupted in flight: one retry
        spdlog::warn("job {}: transfer to {} failed ({}); retrying", job_id, host.host,
                     sent.ToString());
        sent = SendExecutable(PeerAt(host.address).channel, executable, options);
      }
      RETURN_IF_ERROR(sent);
      bytes_sent += static_cast<int64_t>(executable.size());
    }
    config_.registry->AddExecutable(host.host, host.incarnation, fingerprint).IgnoreError();
  }
  return bytes_sent;
}

absl::StatusOr<std::string> JobLauncher::CompileOnWorker(const WorkerInfo& host,
                                                         const v1::Program& program,
                                                         const std::string& compile_options) {
  spdlog::info("compiling program {} on worker {} (this coordinator has another runtime)",
               program.role(), host.host);
  auto context = ContextWithTimeout(config_.rpc_timeout);
  v1::CompileProgramRequest request;
  *request.mutable_program() = program;
  request.set_compile_options(compile_options);
  std::unique_ptr<grpc::ClientReader<v1::LoadExecutableChunk>> reader =
      WorkerStub(host.address).CompileProgram(context.get(), request);
  std::string bytes;
  std::string announced_sha256;
  int64_t total = -1;
  v1::LoadExecutableChunk chunk;
  absl::Status received;
  while (reader->Read(&chunk)) {
    if (chunk.offset() != static_cast<int64_t>(bytes.size())) {
      received = absl::DataLossError("chunk out of order");
      context->TryCancel();
      break;
    }
    if (chunk.offset() == 0) total = chunk.total_bytes();
    bytes += chunk.data();
    if (!chunk.sha256().empty()) announced_sha256 = chunk.sha256();
  }
  absl::Status finished = FromGrpcStatus(reader->Finish());
  if (received.ok()) received = finished;
  if (received.ok() && (static_cast<int64_t>(bytes.size()) != total ||
                        Sha256Hex(bytes) != announced_sha256)) {
    received = absl::DataLossError(absl::StrCat("received ", bytes.size(), " of ", total,
                                                " bytes or a sha256 mismatch"));
  }
  if (!received.ok()) {
    return absl::Status(received.code(), absl::StrCat("compiling program ", program.role(),
                                                      " on worker ", host.host, ": ",
                                                      received.message()));
  }
  return bytes;
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

void JobLauncher::StopWorkers(const v1::JobManifest& job) {
  std::vector<coordinator::WorkerInfo> running;
  for (const WorkerEntry& entry : config_.registry->List()) {
    auto it = job.host_incarnations().find(entry.info.host);
    if (it != job.host_incarnations().end() && it->second == entry.info.incarnation &&
        entry.state == coordinator::WorkerState::kAlive) {
      running.push_back(entry.info);
    }
  }
  // Every host at once, so one hung worker costs the stop its 5 s deadline, not 5 s per host.
  RunConcurrently(running.size(), [&](size_t i) {
    v1::StopJobRequest request;
    request.set_job_id(job.job_id());
    v1::StopJobResponse response;
    auto context = ContextWithTimeout(absl::Seconds(5));
    grpc::Status status = WorkerStub(running[i].address).StopJob(context.get(), request, &response);
    if (!status.ok() && status.error_code() != grpc::StatusCode::NOT_FOUND) {
      spdlog::warn("stopping job {} on {}: {}", job.job_id(), running[i].host,
                   status.error_message());
    }
  });
}

absl::Status JobLauncher::Report(const v1::ReportJobProgressRequest& report) {
  ASSIGN_OR_RETURN(v1::JobManifest job, config_.jobs->Get(report.job_id()));
  RETURN_IF_ERROR(coordinator::CheckJobMember(job, report.host(), report.incarnation()));
  if (coordinator::IsFinal(job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", report.job_id(), " already ended ", coordinator::JobStateName(job.state())));
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
          MarkUnrestorable(job, error);
          host_at_fault = false;
        }
        // The probe takes time: the job may have restarted meanwhile.
        if (absl::StatusOr<v1::JobManifest> now = config_.jobs->Get(report.job_id());
            now.ok() && now->attempts_size() != job.attempts_size()) {
          return;
        }
        Fail(report.job_id(), host, error, host_at_fault).IgnoreError();  // may have ended
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
    if (!coordinator::IsFinal(job.state()) && it != job.host_incarnations().end() &&
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
    if (!WorkerStub(entry.info.address).GetStatus(context.get(), request, &status).ok() ||
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
  preempted_.erase(job_id);
}

}  // namespace meshrun::services
