#include "coordinator_service/coordinator_server.h"

#include <spdlog/spdlog.h>
#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/background_tasks.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "coordinator/progress_monitor.h"
#include "coordinator_service/heartbeat_stream.h"
#include "coordinator_service/program_upload.h"
#include "coordinator_service/relay_stream.h"
#include "coordinator_service/upload_stream.h"
#include "coordinator_service/watch_stream.h"
#include "rpc/identity_slots.h"
#include "rpc/server_support.h"
#include "rpc/tls_credentials.h"
#include "rpc/unary_reactor.h"
#include "runtime/runtime_setup.h"

namespace meshrun::services {

// Every method a callback one but StreamHeartbeats, which is async: HeartbeatStreams serves it
// from a queue of its own. The watch methods are registered raw: their reactors write
// pre-serialized summaries (watch_stream.h). Written out rather than layered on CallbackService:
// gRPC 1.51 keeps a callback method's handler when it is re-marked async, and the server then
// never learns the service has an async method. So a new RPC is added here; one left out stays
// a sync method answering UNIMPLEMENTED, which worker_fleet_rpc_test checks no method does.
using CoordinatorMethods =
    v1::Coordinator::WithCallbackMethod_GetSupportedVersions<
    v1::Coordinator::WithCallbackMethod_RegisterWorker<
    v1::Coordinator::WithCallbackMethod_Heartbeat<
    v1::Coordinator::WithAsyncMethod_StreamHeartbeats<
    v1::Coordinator::WithCallbackMethod_DeregisterWorker<
    v1::Coordinator::WithCallbackMethod_ListWorkers<
    v1::Coordinator::WithCallbackMethod_SubmitJob<
    v1::Coordinator::WithCallbackMethod_UploadProgram<
    v1::Coordinator::WithCallbackMethod_GetJob<
    v1::Coordinator::WithCallbackMethod_ListJobs<
    v1::Coordinator::WithCallbackMethod_CancelJob<
    v1::Coordinator::WithCallbackMethod_KeyValueSet<
    v1::Coordinator::WithCallbackMethod_KeyValueGet<
    v1::Coordinator::WithCallbackMethod_KeyValueTryGet<
    v1::Coordinator::WithCallbackMethod_KeyValueList<
    v1::Coordinator::WithCallbackMethod_KeyValueDelete<
    v1::Coordinator::WithCallbackMethod_WaitAtBarrier<
    v1::Coordinator::WithCallbackMethod_UploadTelemetry<
    v1::Coordinator::WithCallbackMethod_RelayTelemetry<
    v1::Coordinator::WithRawCallbackMethod_WatchTelemetry<
    v1::Coordinator::WithRawCallbackMethod_WatchTelemetryBatches<
    v1::Coordinator::WithCallbackMethod_ReportJobProgress<
    v1::Coordinator::WithCallbackMethod_GetMetrics<
    v1::Coordinator::WithCallbackMethod_GetDeviceMemory<
    v1::Coordinator::WithCallbackMethod_ReportCheckpoint<
    v1::Coordinator::WithCallbackMethod_CheckpointJob<
    v1::Coordinator::WithCallbackMethod_DrainWorker<
    v1::Coordinator::WithCallbackMethod_PreemptJob<
    v1::Coordinator::Service>>>>>>>>>>>>>>>>>>>>>>>>>>>>;

class CoordinatorServer::Service final : public CoordinatorMethods {
 public:
  Service(CoordinatorRpcHandler* handler, coordinator::ProgramStore* programs,
          const CoordinatorLimits& limits)
      : handler_(handler),
        programs_(programs),
        watch_slots_(limits.max_watch_streams, limits.max_watch_streams_per_identity,
                     "WatchTelemetry streams", "--max_watch_streams",
                     "--max_watch_streams_per_identity"),
        upload_slots_(limits.max_upload_streams, 0, "UploadTelemetry streams",
                      "--max_upload_streams", ""),
        heartbeat_slots_(limits.max_upload_streams, 0, "StreamHeartbeats streams",
                         "--max_upload_streams", ""),
        slow_slots_(limits.max_slow_calls, limits.max_slow_calls_per_identity,
                    "calls waiting on disk or workers (SubmitJob, UploadProgram, GetMetrics, "
                    "GetDeviceMemory, DrainWorker, CheckpointJob, PreemptJob, "
                    "ReportJobProgress, ReportCheckpoint)",
                    "--max_slow_calls", "--max_slow_calls_per_identity") {}

  // Waits for the slow calls' threads; after the server stopped taking calls (Drain).
  void JoinSlowCalls() { slow_calls_.JoinAll(); }
  IdentitySlots& heartbeat_slots() { return heartbeat_slots_; }

  grpc::ServerUnaryReactor* GetSupportedVersions(grpc::CallbackServerContext* context,
                                                 const v1::GetSupportedVersionsRequest* request,
                                                 v1::SupportedVersions* response) override {
    return FinishUnary(context, [&] { return handler_->GetSupportedVersions(*request, response); });
  }
  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override {
    return FinishUnary(context, [&] {
      RETURN_IF_ERROR(CheckWorkerHost(*context, request->registration().host()));
      return handler_->RegisterWorker(*request, response);
    });
  }
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override {
    return FinishUnary(context, [&] {
      RETURN_IF_ERROR(CheckWorkerHost(*context, request->host()));
      return handler_->Heartbeat(*request, response);
    });
  }
  grpc::ServerUnaryReactor* DeregisterWorker(grpc::CallbackServerContext* context,
                                             const v1::DeregisterWorkerRequest* request,
                                             v1::DeregisterWorkerResponse* response) override {
    return FinishUnary(context, [&] {
      RETURN_IF_ERROR(CheckWorkerHost(*context, request->host()));
      return handler_->DeregisterWorker(*request, response);
    });
  }
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override {
    return FinishUnary(context, [&] {
      response->set_coordinator_insecure(ServingInsecurely());
      return handler_->ListWorkers(*request, response);
    });
  }
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override {
    // Reads the data receipt's files and writes the programs: off the callback thread.
    return OffThread(context, [this, request, response, client = ClientKey(*context)] {
      return handler_->SubmitJob(*request, response, client);
    });
  }
  grpc::ServerReadReactor<v1::ProgramChunk>* UploadProgram(
      grpc::CallbackServerContext* context, v1::UploadProgramResponse* response) override {
    return StartProgramUpload(programs_, response, slow_slots_.Acquire(PeerIdentity(*context)));
  }
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::JobManifest* response) override {
    return FinishUnary(context, [&] { return handler_->GetJob(*request, response); });
  }
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override {
    return FinishUnary(context, [&] { return handler_->ListJobs(*request, response); });
  }
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override {
    return FinishUnary(context, [&] { return handler_->CancelJob(*request, response); });
  }
  grpc::ServerUnaryReactor* ReportJobProgress(grpc::CallbackServerContext* context,
                                              const v1::ReportJobProgressRequest* request,
                                              v1::ReportJobProgressResponse* response) override {
    // A job's end discards its uncommitted checkpoints on disk: off the callback thread.
    return OffThread(context, [this, context, request, response] {
      RETURN_IF_ERROR(CheckWorkerHost(*context, request->host()));
      RETURN_IF_ERROR(Member(context, request->job_id(), request->incarnation()));
      return handler_->ReportJobProgress(*request, response);
    });
  }
  grpc::ServerUnaryReactor* ReportCheckpoint(grpc::CallbackServerContext* context,
                                             const v1::ReportCheckpointRequest* request,
                                             v1::ReportCheckpointResponse* response) override {
    // The last host's report writes the commit: off the callback thread.
    return OffThread(context, [this, context, request, response] {
      RETURN_IF_ERROR(CheckWorkerHost(*context, request->host()));
      RETURN_IF_ERROR(Member(context, request->job_id(), request->incarnation()));
      return handler_->ReportCheckpoint(*request, response);
    });
  }
  grpc::ServerUnaryReactor* CheckpointJob(grpc::CallbackServerContext* context,
                                          const v1::CheckpointJobRequest* request,
                                          v1::CheckpointJobResponse* response) override {
    return OffThread(context, [this, request, response] {  // asks the job's hosts, 5 s at worst
      return handler_->CheckpointJob(*request, response);
    });
  }
  grpc::ServerUnaryReactor* DrainWorker(grpc::CallbackServerContext* context,
                                        const v1::DrainWorkerRequest* request,
                                        v1::DrainWorkerResponse* response) override {
    return OffThread(context, [this, request, response] {  // relays to the worker, 5 s at worst
      return handler_->DrainWorker(*request, response);
    });
  }

  grpc::ServerUnaryReactor* PreemptJob(grpc::CallbackServerContext* context,
                                       const v1::PreemptJobRequest* request,
                                       v1::PreemptJobResponse* response) override {
    return OffThread(context, [this, context, request, response] {  // CheckpointJob's waits
      RETURN_IF_ERROR(CheckWorkerHost(*context, request->host()));
      RETURN_IF_ERROR(Member(context, request->job_id(), request->incarnation()));
      return handler_->PreemptJob(*request, response);
    });
  }
  grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck>* UploadTelemetry(
      grpc::CallbackServerContext* context) override {
    return StartUploadStream(&handler_->telemetry(), &handler_->membership(), context,
                             upload_slots_.Acquire(PeerIdentity(*context)));
  }
  grpc::ServerBidiReactor<v1::HostSummaryBatch, v1::UploadTelemetryAckBatch>* RelayTelemetry(
      grpc::CallbackServerContext* context) override {
    return StartRelayStream(&handler_->telemetry(), &handler_->membership(), context,
                            upload_slots_.Acquire(PeerIdentity(*context)));
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchTelemetry(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override {
    return StartWatchStream(handler_->telemetry().hub(), *request,
                            watch_slots_.Acquire(PeerIdentity(*context)),
                            WatchFraming::kOnePerMessage,
                            RecheckCaller(*context, "/meshrun.v1.Coordinator/WatchTelemetry"));
  }
  grpc::ServerWriteReactor<grpc::ByteBuffer>* WatchTelemetryBatches(
      grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) override {
    return StartWatchStream(
        handler_->telemetry().hub(), *request, watch_slots_.Acquire(PeerIdentity(*context)),
        WatchFraming::kBatches,
        RecheckCaller(*context, "/meshrun.v1.Coordinator/WatchTelemetryBatches"));
  }
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* context,
                                       const v1::GetMetricsRequest* request,
                                       v1::GetMetricsResponse* response) override {
    return OffThread(context, [this, request, response] {  // asks every worker, 5 s at worst
      return handler_->GetMetrics(*request, response);
    });
  }
  grpc::ServerUnaryReactor* GetDeviceMemory(grpc::CallbackServerContext* context,
                                            const v1::GetDeviceMemoryRequest* request,
                                            v1::GetDeviceMemoryResponse* response) override {
    return OffThread(context, [this, request, response] {  // asks the worker, 5 s at worst
      return handler_->GetDeviceMemory(*request, response);
    });
  }
  grpc::ServerUnaryReactor* KeyValueSet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueSetRequest* request,
                                        v1::KeyValueSetResponse* response) override {
    return FinishUnary(context, [&] {
      RETURN_IF_ERROR(KeyAllowed(context, request->key()));
      return handler_->KeyValueSet(*request, response);
    });
  }
  grpc::ServerUnaryReactor* KeyValueTryGet(grpc::CallbackServerContext* context,
                                           const v1::KeyValueGetRequest* request,
                                           v1::KeyValueGetResponse* response) override {
    return FinishUnary(context, [&] {
      RETURN_IF_ERROR(KeyAllowed(context, request->key()));
      return handler_->KeyValueTryGet(*request, response);
    });
  }
  grpc::ServerUnaryReactor* KeyValueList(grpc::CallbackServerContext* context,
                                         const v1::KeyValueListRequest* request,
                                         v1::KeyValueListResponse* response) override {
    return FinishUnary(context, [&] {
      RETURN_IF_ERROR(KeyAllowed(context, request->directory()));
      return handler_->KeyValueList(*request, response);
    });
  }
  grpc::ServerUnaryReactor* KeyValueDelete(grpc::CallbackServerContext* context,
                                           const v1::KeyValueDeleteRequest* request,
                                           v1::KeyValueDeleteResponse* response) override {
    return FinishUnary(context, [&] {
      RETURN_IF_ERROR(KeyAllowed(context, request->key()));
      return handler_->KeyValueDelete(*request, response);
    });
  }
  // The waiting RPCs finish from the store's callback; the server thread returns at once.
  grpc::ServerUnaryReactor* KeyValueGet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueGetRequest* request,
                                        v1::KeyValueGetResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (absl::Status s = KeyAllowed(context, request->key()); !s.ok()) return Refuse(reactor, s);
    handler_->KeyValueGet(*request, [reactor, response](absl::StatusOr<std::string> value) {
      if (value.ok()) *response->mutable_value() = std::move(*value);
      reactor->Finish(ToGrpcStatus(value.status()));
    });
    return reactor;
  }
  grpc::ServerUnaryReactor* WaitAtBarrier(grpc::CallbackServerContext* context,
                                          const v1::WaitAtBarrierRequest* request,
                                          v1::WaitAtBarrierResponse*) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    if (absl::Status s = KeyAllowed(context, request->barrier_id()); !s.ok()) {
      return Refuse(reactor, s);
    }
    handler_->WaitAtBarrier(*request, [reactor](absl::Status status) {
      reactor->Finish(ToGrpcStatus(status));
    });
    return reactor;
  }

 private:
  // Calls that wait on disk or workers run on slow_calls_' threads (limits: --max_slow_calls),
  // so gRPC's callback threads stay free for heartbeats.
  template <typename Handler>
  grpc::ServerUnaryReactor* OffThread(grpc::CallbackServerContext* context, Handler handler) {
    absl::StatusOr<IdentitySlots::Slot> slot = slow_slots_.Acquire(PeerIdentity(*context));
    if (!slot.ok()) return Refuse(context->DefaultReactor(), slot.status());
    return FinishUnaryOffThread(
        context, slow_calls_,
        [handler = std::move(handler),
         slot = std::make_shared<IdentitySlots::Slot>(std::move(*slot))]() mutable {
          const absl::Status status = handler();
          slot.reset();  // free before the client hears, so its next call finds it
          return status;
        });
  }
  // security: a worker reaches only the keys and reports of its jobs (job_membership.h).
  absl::Status KeyAllowed(grpc::CallbackServerContext* context, const std::string& key) {
    return handler_->membership().CheckKey(PeerIdentity(*context), key);
  }
  absl::Status Member(grpc::CallbackServerContext* context, const std::string& job_id,
                      const std::string& incarnation) {
    return handler_->membership().CheckMember(PeerIdentity(*context), job_id, incarnation);
  }
  static grpc::ServerUnaryReactor* Refuse(grpc::ServerUnaryReactor* reactor, absl::Status s) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }

  CoordinatorRpcHandler* const handler_;
  coordinator::ProgramStore* const programs_;
  IdentitySlots watch_slots_;  // limits: --max_watch_streams, a share per identity
  IdentitySlots upload_slots_;  // limits: --max_upload_streams, no share (one a worker)
  IdentitySlots heartbeat_slots_;  // limits: as upload_slots_, a pool of its own
  IdentitySlots slow_slots_;   // limits: --max_slow_calls, a share per identity
  BackgroundTasks slow_calls_;  // joined by Drain, before the server goes
};

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(Config config) {
  RETURN_IF_ERROR(ParseHostPort("listen", config.listen).status());
  RETURN_IF_ERROR(PrepareStateDir("state_dir", config.state_dir));
  if (config.heartbeat_timeout < absl::Milliseconds(10)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--heartbeat_timeout=", absl::FormatDuration(config.heartbeat_timeout),
        " is too short; use at least 10ms (the default is 10s)"));
  }
  if (config.telemetry_relay_hosts < 0 || config.telemetry_relay_hosts == 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--telemetry_relay_hosts=", config.telemetry_relay_hosts,
        " names no group to relay for; use 2 or more hosts a group, or 0 to turn relays off "
        "(the default is 64)"));
  }
  RETURN_IF_ERROR(CheckRequestLimits(config.limits));
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  ASSIGN_OR_RETURN(server->registry_,
                   coordinator::WorkerRegistry::Create(
                       {.heartbeat_timeout = config.heartbeat_timeout,
                        .forget_after = config.limits.worker_forget_after,
                        .clock = config.clock}));
  ASSIGN_OR_RETURN(server->kv_, coordinator::KeyValueStore::Create({}));
  ASSIGN_OR_RETURN(server->cache_, coordinator::ExecutableCache::Create(
                                       {.directory = config.state_dir + "/executables",
                                        .max_bytes = config.cache_max_bytes,
                                        .clock = config.clock}));
  if (!config.pjrt_plugin.empty()) {
    ASSIGN_OR_RETURN(server->runtime_, CreatePjrtRuntime(config.pjrt_plugin, config.cpu_devices));
    spdlog::info("coordinator compiles with {}", runtime::ToString(server->runtime_->identity()));
  }
  ASSIGN_OR_RETURN(server->telemetry_,
                   CoordinatorTelemetry::Create({.database = config.state_dir + "/telemetry.db",
                                                 .grace = config.telemetry_grace,
                                                 .admit = CoordinatorTelemetry::RegistryFence(
                                                     server->registry_.get()),
                                                 .history_max_age = config.limits.history_retention,
                                                 .history_max_steps = config.limits.history_max_steps,
                                                 .on_nonfinite = NonFiniteRecorder(server.get())}));
  // Job ids continue past those the history knows, so a restart never reuses one.
  int64_t first_id = 1;
  ASSIGN_OR_RETURN(std::vector<std::string> known, server->telemetry_->KnownJobs());
  for (const std::string& id : known) {
    int64_t n = 0;
    if (absl::StartsWith(id, "job-") && absl::SimpleAtoi(id.substr(4), &n)) {
      first_id = std::max(first_id, n + 1);
    }
  }
  // The job table is kept in the same database: a restart forgets no job.
  telemetry::HistoryStore* history = &server->telemetry_->history();
  std::vector<v1::JobManifest> restored;
  ASSIGN_OR_RETURN(auto saved, history->SavedJobs());
  for (const auto& [id, bytes] : saved) {
    v1::JobManifest job;
    if (!job.ParseFromString(bytes)) {
      spdlog::error("saved job {} does not parse; it is left out", id);
      continue;
    }
    job = coordinator::RestoredAfterRestart(std::move(job), config.clock->Now());
    if (job.state() == v1::JOB_STATE_RUNNING) server->restored_running_.push_back(id);
    restored.push_back(std::move(job));
  }
  ASSIGN_OR_RETURN(server->jobs_,
                   coordinator::JobTable::Create(
                       {.clock = config.clock,
                        .first_id = first_id,
                        .restored = restored,
                        .on_change = [history](const v1::JobManifest& job) {
                          absl::Status saved =
                              history->SaveJob(job.job_id(), WithoutPrograms(job).SerializeAsString());
                          if (!saved.ok()) {
                            spdlog::error("job {} not saved: {}", job.job_id(), saved.ToString());
                          }
                        }}));
  // Restored jobs as they are now (the unfinished launches just failed).
  for (const v1::JobManifest& job : restored) {
    history->SaveJob(job.job_id(), job.SerializeAsString()).IgnoreError();
  }
  if (!restored.empty()) {
    spdlog::info("restored {} jobs ({} running; their workers have {} to come back)",
                 restored.size(), server->restored_running_.size(),
                 absl::FormatDuration(2 * config.heartbeat_timeout));
  }
  server->clock_ = config.clock;
  server->limits_ = config.limits;
  ASSIGN_OR_RETURN(server->progress_,
                   coordinator::ProgressMonitor::Create(
                       {.hang_timeout = config.hang_timeout, .clock = config.clock}));
  server->restored_check_at_ = config.clock->Now() + 2 * config.heartbeat_timeout;
  ASSIGN_OR_RETURN(server->admission_, SubmitAdmission::Create(config.limits, config.state_dir));
  if (!config.tpu_compiler_plugin.empty()) {
    server->target_compilers_ = std::make_unique<TargetCompilers>(config.tpu_compiler_plugin);
  }
  server->launcher_ = std::make_unique<JobLauncher>(
      JobLauncher::Config{.registry = server->registry_.get(),
                          .jobs = server->jobs_.get(),
                          .cache = server->cache_.get(),
                          .runtime = server->runtime_.get(),
                          .target_compilers = server->target_compilers_.get(),
                          .telemetry = server->telemetry_.get(),
                          .progress = server->progress_.get(),
                          .restart_wait = config.restart_wait,
                          .programs = server->admission_->programs(),
                          .telemetry_relay_hosts = config.telemetry_relay_hosts});
  server->handler_ = std::make_unique<CoordinatorRpcHandler>(
      server->registry_.get(), server->kv_.get(), server->jobs_.get(), server->launcher_.get(),
      server->telemetry_.get());
  server->handler_->SetAdmission(server->admission_.get());
  server->service_ = std::make_unique<Service>(server->handler_.get(),
                                               server->admission_->programs(), config.limits);
  ASSIGN_OR_RETURN(StartedServer started,
                   StartGrpcServer("listen", config.listen, {server->service_.get()},
                                   {.max_message_bytes = config.limits.max_request_bytes,
                                    .max_buffered_bytes = config.limits.max_request_memory},
                                   &server->heartbeat_queue_));
  server->server_ = std::move(started.server);
  server->port_ = started.port;
  server->heartbeats_ = std::make_unique<HeartbeatStreams>(
      [service = server->service_.get()](grpc::ServerContext* context,
                                         HeartbeatStreams::Stream* stream,
                                         grpc::ServerCompletionQueue* queue, void* tag) {
        service->RequestStreamHeartbeats(context, stream, queue, queue, tag);
      },
      server->heartbeat_queue_.get(), server->handler_.get(), &server->service_->heartbeat_slots());
  server->heartbeat_thread_ = std::thread([s = server.get()] { s->heartbeats_->Run(); });
  server->sweeper_ = std::thread([s = server.get()] { s->SweepLiveness(); });
  if (!config.http_listen.empty()) {
    ASSIGN_OR_RETURN(server->dashboard_,
                     DashboardApi::Create({.handler = server->handler_.get(),
                                           .history = &server->telemetry_->history()}));
    ASSIGN_OR_RETURN(server->http_,
                     HttpServer::Start({.listen = config.http_listen,
                                        .web_root = config.web_root,
                                        .api = server->dashboard_.get(),
                                        .max_streams = config.http_max_streams,
                                        .max_streams_per_identity =
                                            config.http_max_streams_per_identity,
                                        .max_admin_streams = config.http_max_admin_streams}));
    spdlog::info("coordinator HTTP on port {}: dashboard at /, Prometheus at /metrics",
                 server->http_->port());
  }
  spdlog::info("coordinator listening on port {} (state {}, heartbeat timeout {})", server->port_,
               config.state_dir, absl::FormatDuration(config.heartbeat_timeout));
  return server;
}

void CoordinatorServer::SweepLiveness() {
  absl::Duration period = registry_->heartbeat_timeout() / 4;
  if (progress_->hang_timeout() > absl::ZeroDuration()) {
    period = std::min(period, progress_->hang_timeout() / 4);
  }
  while (!stop_sweeper_.WaitForNotificationWithTimeout(period)) {
    for (const coordinator::WorkerEntry& dead : registry_->ExpireOverdue()) {
      spdlog::warn("worker {} (incarnation {}) is DEAD: {}", dead.info.host,
                   dead.info.incarnation, dead.state_reason);
      launcher_->OnWorkerDead(dead);
    }
    launcher_->FailHungJobs();
    ForgetUnusedChannels();
    CheckRestoredJobs();
    PruneFinished();
  }
}

void CoordinatorServer::ForgetUnusedChannels() {
  std::set<std::string> alive;
  for (const auto& [host, address] : registry_->AliveAddresses()) {
    alive.insert(WorkerChannels::Key(host, address));
  }
  if (const int dropped = launcher_->channels().KeepOnly(alive); dropped > 0) {
    spdlog::debug("closed the channels to {} workers no longer alive there", dropped);
  }
}

void CoordinatorServer::PruneFinished() {
  const absl::Time now = clock_->Now();
  // A burst of short jobs must not wait a minute: memory grows with every job held. The 10%
  // slack keeps a steady stream of finishing jobs from sorting the table on every sweep.
  const int64_t cap = limits_.max_finished_jobs;
  const bool over_cap = cap > 0 && jobs_->FinishedCount() > cap + cap / 10;
  if (now - pruned_at_ < absl::Minutes(1) && !over_cap) return;
  pruned_at_ = now;
  const std::vector<std::string> jobs =
      jobs_->PruneFinished(limits_.job_retention, limits_.max_finished_jobs);
  for (const std::string& id : jobs) {
    int64_t n = 0;
    (void)absl::SimpleAtoi(absl::StripPrefix(id, "job-"), &n);
    admission_->programs()->Release(id);
    if (absl::Status s = telemetry_->ForgetJob(id, n); !s.ok()) {
      spdlog::error("job {} pruned, but its telemetry history stays: {}", id, s.ToString());
    }
  }
  if (!jobs.empty()) {
    spdlog::info("pruned {} finished jobs (--job_retention, --max_finished_jobs)", jobs.size());
  }
  absl::StatusOr<int64_t> pruned = telemetry_->history().Prune();
  if (!pruned.ok()) spdlog::error("telemetry history retention: {}", pruned.status().ToString());
  if (pruned.ok() && *pruned > 0) spdlog::info("telemetry history: pruned {} summaries", *pruned);
}

std::function<void(const std::string&, int64_t, const std::string&)>
CoordinatorServer::NonFiniteRecorder(CoordinatorServer* server) {
  // Summaries come only for submitted jobs, so jobs_ (made after the telemetry) exists by then.
  return [server](const std::string& job_id, int64_t step, const std::string& series) {
    absl::Status marked = server->jobs_->Update(job_id, [&](v1::JobManifest& m) {
      if (m.nonfinite_step() != 0) return;
      m.set_nonfinite_step(step);
      m.set_nonfinite_series(series);
    });
    if (marked.ok()) {
      spdlog::warn("job {}: series \"{}\" is not finite at step {}", job_id, series, step);
    }
  };
}

void CoordinatorServer::CheckRestoredJobs() {
  if (restored_running_.empty() || clock_->Now() < restored_check_at_) return;
  std::set<std::pair<std::string, std::string>> alive;  // (host, incarnation)
  for (const coordinator::WorkerEntry& entry : registry_->List()) {
    if (entry.state == coordinator::WorkerState::kAlive) {
      alive.emplace(entry.info.host, entry.info.incarnation);
    }
  }
  for (const std::string& id : restored_running_) {
    absl::StatusOr<v1::JobManifest> job = jobs_->Get(id);
    if (!job.ok() || job->state() != v1::JOB_STATE_RUNNING) continue;
    for (const auto& [host, incarnation] : job->host_incarnations()) {
      if (alive.contains({host, incarnation})) continue;
      launcher_->Fail(id, host,
                      absl::StrCat("worker ", host, " (incarnation ", incarnation,
                                   ") did not come back after the coordinator restarted"))
          .IgnoreError();
      break;
    }
  }
  restored_running_.clear();
}

void CoordinatorServer::Drain(absl::Duration deadline) {
  if (drained_.exchange(true) || server_ == nullptr) return;  // null: Start() failed
  handler_->SetDraining();
  if (http_) http_->Stop();  // its streams end; it calls into the handler no more
  kv_->CancelWaiters();  // long waits end now, cleanly, rather than at the deadline
  DrainServer(*server_, deadline);
  heartbeats_->ShutdownQueue();  // the server is down: Run drains what is left and returns
  heartbeat_thread_.join();
  service_->JoinSlowCalls();  // they finish their calls, bounded by their workers' deadlines
  stop_sweeper_.Notify();
  sweeper_.join();
}

CoordinatorServer::~CoordinatorServer() { Drain(absl::ZeroDuration()); }

}  // namespace meshrun::services
