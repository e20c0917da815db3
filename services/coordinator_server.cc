#include "services/coordinator_server.h"
#include "services/tls_credentials.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <map>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/background_tasks.h"
#include "common/grpc_status.h"
#include "common/protocol.h"
#include "common/status_macros.h"
#include "coordinator/goodput.h"
#include "coordinator/job_validation.h"
#include "coordinator/mesh_planner.h"
#include "services/runtime_setup.h"
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
  // Heartbeats carry job progress: with hang detection on, 4 reports per hang timeout.
  absl::Duration interval = registry_->heartbeat_interval();
  if (launcher_->hang_timeout() > absl::ZeroDuration()) {
    interval = std::min(interval, launcher_->hang_timeout() / 4);
  }
  response->set_heartbeat_interval_millis(absl::ToInt64Milliseconds(interval));
  response->set_heartbeat_timeout_millis(absl::ToInt64Milliseconds(registry_->heartbeat_timeout()));
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::Heartbeat(const v1::HeartbeatRequest& request,
                                              v1::HeartbeatResponse*) {
  if (request.host().empty()) return absl::InvalidArgumentError("host is empty");
  RETURN_IF_ERROR(registry_->Heartbeat(request.host(), request.incarnation()));
  if (!request.job_id().empty()) {
    launcher_->ReportProgress(request.host(), request.job_id(), request.last_completed_step(),
                              request.phase());
  }
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::DeregisterWorker(const v1::DeregisterWorkerRequest& request,
                                                     v1::DeregisterWorkerResponse*) {
  if (request.host().empty()) return absl::InvalidArgumentError("host is empty");
  RETURN_IF_ERROR(registry_->Deregister(request.host(), request.incarnation()));
  spdlog::info("worker {} left (incarnation {})", request.host(), request.incarnation());
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::ListWorkers(const v1::ListWorkersRequest& request,
                                                v1::ListWorkersResponse* response) {
  runtime::RuntimeIdentity pin;
  if (!request.job_id().empty()) {
    ASSIGN_OR_RETURN(v1::JobManifest job, jobs_->Get(request.job_id()));
    pin = FromProto(job.has_runtime() ? job.runtime() : job.spec().runtime_pin());
  }
  const std::vector<coordinator::WorkerEntry> entries = registry_->List();
  std::vector<coordinator::WorkerInfo> alive;
  for (const coordinator::WorkerEntry& entry : entries) {
    if (entry.state == coordinator::WorkerState::kAlive) alive.push_back(entry.info);
  }
  std::map<std::string, std::string> excluded;  // host -> why the pin leaves it out
  for (const coordinator::HostExclusion& e : coordinator::PinRuntime(alive, pin).excluded) {
    excluded[e.host] = e.reason;
  }
  for (const coordinator::WorkerEntry& entry : entries) {
    v1::WorkerStatus* status = response->add_workers();
    *status->mutable_registration() = ToProto(entry.info);
    status->set_state(ToProto(entry.state));
    status->set_last_heartbeat_unix_micros(absl::ToUnixMicros(entry.last_heartbeat));
    status->set_state_reason(entry.state_reason);
    auto reason = excluded.find(entry.info.host);
    if (reason != excluded.end()) status->set_exclusion_reason(reason->second);
  }
  return absl::OkStatus();
}

namespace {
// Manifests as clients see them: without the program bytes they submitted.
v1::JobManifest WithoutPrograms(v1::JobManifest job) {
  for (v1::Program& program : *job.mutable_spec()->mutable_programs()) {
    program.clear_stablehlo();
  }
  return job;
}
}  // namespace

absl::Status CoordinatorRpcHandler::SubmitJob(const v1::SubmitJobRequest& request,
                                              v1::SubmitJobResponse* response) {
  if (draining_) return absl::UnavailableError("coordinator is draining; submit elsewhere");
  RETURN_IF_ERROR(coordinator::ValidateJobSpec(request.spec()));
  ASSIGN_OR_RETURN(v1::DataReceipt receipt, coordinator::ReadDataReceipt(request.spec()));
  ASSIGN_OR_RETURN(const int64_t restored_step, coordinator::RestoredStep(request.spec()));
  response->set_job_id(jobs_->Add(request.spec()));
  RETURN_IF_ERROR(jobs_->Update(response->job_id(), [&](v1::JobManifest& m) {
    *m.mutable_data_receipt() = std::move(receipt);
    m.set_restored_step(restored_step);
  }));
  if (!request.spec().telemetry().empty()) {
    RETURN_IF_ERROR(telemetry_->DeclareJob(response->job_id(), request.spec()));
  }
  spdlog::info("job {} ({}) submitted: {} steps", response->job_id(), request.spec().name(),
               request.spec().steps());
  launcher_->Launch(response->job_id());
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::GetJob(const v1::GetJobRequest& request,
                                           v1::JobManifest* response) {
  if (request.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
  ASSIGN_OR_RETURN(v1::JobManifest job, jobs_->Get(request.job_id()));
  *response = WithoutPrograms(std::move(job));
  if (telemetry_ != nullptr) {
    for (const std::string& host : telemetry_->Stragglers(request.job_id())) {
      response->add_straggler_hosts(host);
    }
  }
  telemetry_->ShowLiveStep(response);  // sdk: a running job's current step
  coordinator::FillGoodput(telemetry_->step_times(), absl::Now(), response);
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::ListJobs(const v1::ListJobsRequest&,
                                             v1::ListJobsResponse* response) {
  for (v1::JobManifest& job : jobs_->List()) {
    v1::JobManifest* listed = response->add_jobs();
    *listed = WithoutPrograms(job);
    if (telemetry_ == nullptr) continue;
    for (const std::string& host : telemetry_->Stragglers(job.job_id())) {
      listed->add_straggler_hosts(host);
    }
    telemetry_->ShowLiveStep(listed);  // sdk: a running job's current step
    coordinator::FillGoodput(telemetry_->step_times(), absl::Now(), listed);
  }
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::CancelJob(const v1::CancelJobRequest& request,
                                              v1::CancelJobResponse*) {
  if (request.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
  return launcher_->Cancel(request.job_id());
}

absl::Status CoordinatorRpcHandler::ReportJobProgress(const v1::ReportJobProgressRequest& request,
                                                      v1::ReportJobProgressResponse*) {
  if (request.job_id().empty() || request.host().empty()) {
    return absl::InvalidArgumentError("job_id and host must be set");
  }
  absl::Status status = launcher_->Report(request);
  // A job from before a coordinator restart: its telemetry was resumed and ends with its hosts.
  if (absl::IsNotFound(status) && coordinator::IsFinal(request.state())) {
    telemetry_->HostEnded(request.job_id(), request.host());
  }
  return status;
}

namespace {
// The address of an ALIVE host, or NOT_FOUND / UNAVAILABLE naming it.
absl::StatusOr<std::string> AliveAddress(coordinator::WorkerRegistry& registry,
                                         const std::string& host) {
  for (const coordinator::WorkerEntry& entry : registry.List()) {
    if (entry.info.host != host) continue;
    if (entry.state != coordinator::WorkerState::kAlive) {
      return absl::UnavailableError(absl::StrCat("host ", host, " is ",
                                                 coordinator::WorkerStateName(entry.state)));
    }
    return entry.info.address;
  }
  return absl::NotFoundError(absl::StrCat("host ", host, " is not registered"));
}
}  // namespace

absl::Status CoordinatorRpcHandler::GetMetrics(const v1::GetMetricsRequest& request,
                                               v1::GetMetricsResponse* response) {
  std::vector<std::pair<std::string, std::string>> hosts;  // host, address
  if (!request.host().empty()) {
    ASSIGN_OR_RETURN(std::string address, AliveAddress(*registry_, request.host()));
    hosts.emplace_back(request.host(), address);
  } else {
    for (const coordinator::WorkerEntry& entry : registry_->List()) {
      if (entry.state == coordinator::WorkerState::kAlive) {
        hosts.emplace_back(entry.info.host, entry.info.address);
      }
    }
  }
  // Every host at once, so one hung worker costs a scrape its 5 s deadline, not 5 s per host.
  std::vector<v1::WorkerStatusReport> statuses(hosts.size());
  std::vector<grpc::Status> rpcs(hosts.size());
  RunConcurrently(hosts.size(), [&](size_t i) {
    auto context = ContextWithTimeout(absl::Seconds(5));
    rpcs[i] = v1::Worker::NewStub(MakeChannel(hosts[i].second))
                  ->GetStatus(context.get(), v1::GetStatusRequest(), &statuses[i]);
  });
  for (size_t i = 0; i < hosts.size(); ++i) {
    if (!rpcs[i].ok()) {
      if (!request.host().empty()) return FromGrpcStatus(rpcs[i]);
      continue;  // a host that just died is not the caller's problem in a cluster view
    }
    v1::HostMetrics* metrics = response->add_hosts();
    metrics->set_host(hosts[i].first);
    *metrics->mutable_metrics() = statuses[i].metrics();
  }
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::GetDeviceMemory(const v1::GetDeviceMemoryRequest& request,
                                                    v1::GetDeviceMemoryResponse* response) {
  if (request.host().empty()) return absl::InvalidArgumentError("host is empty; name a worker");
  ASSIGN_OR_RETURN(std::string address, AliveAddress(*registry_, request.host()));
  v1::WorkerDeviceMemoryRequest ask;
  ask.set_runtime_name(request.runtime_name());
  v1::WorkerDeviceMemoryResponse answer;
  auto context = ContextWithTimeout(absl::Seconds(5));
  RETURN_IF_ERROR(FromGrpcStatus(v1::Worker::NewStub(MakeChannel(address))
                                     ->GetDeviceMemory(context.get(), ask, &answer)));
  *response->mutable_devices() = answer.devices();
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::KeyValueSet(const v1::KeyValueSetRequest& request,
                                                v1::KeyValueSetResponse*) {
  return kv_->Set(request.key(), request.value(), request.allow_overwrite());
}

absl::Status CoordinatorRpcHandler::KeyValueTryGet(const v1::KeyValueGetRequest& request,
                                                   v1::KeyValueGetResponse* response) {
  ASSIGN_OR_RETURN(*response->mutable_value(), kv_->TryGet(request.key()));
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::KeyValueList(const v1::KeyValueListRequest& request,
                                                 v1::KeyValueListResponse* response) {
  if (request.directory().empty()) return absl::InvalidArgumentError("directory is empty");
  for (auto& [key, value] : kv_->List(request.directory())) {
    v1::KeyValueEntry* entry = response->add_entries();
    entry->set_key(key);
    entry->set_value(value);
  }
  return absl::OkStatus();
}

absl::Status CoordinatorRpcHandler::KeyValueDelete(const v1::KeyValueDeleteRequest& request,
                                                   v1::KeyValueDeleteResponse*) {
  return kv_->Delete(request.key());
}

namespace {
absl::StatusOr<absl::Duration> WaitTimeout(int64_t millis, const char* field) {
  if (millis < 0) {
    return absl::InvalidArgumentError(absl::StrCat(field, " is negative; give milliseconds >= 0"));
  }
  return std::min(absl::Milliseconds(millis), CoordinatorRpcHandler::kMaxWait);
}
}  // namespace

void CoordinatorRpcHandler::KeyValueGet(const v1::KeyValueGetRequest& request,
                                        std::function<void(absl::StatusOr<std::string>)> done) {
  absl::StatusOr<absl::Duration> timeout = WaitTimeout(request.timeout_millis(), "timeout_millis");
  if (!timeout.ok()) return done(timeout.status());
  kv_->GetAsync(request.key(), absl::Now() + *timeout, std::move(done));
}

void CoordinatorRpcHandler::WaitAtBarrier(const v1::WaitAtBarrierRequest& request,
                                          std::function<void(absl::Status)> done) {
  absl::StatusOr<absl::Duration> timeout = WaitTimeout(request.timeout_millis(), "timeout_millis");
  if (!timeout.ok()) return done(timeout.status());
  kv_->WaitAtBarrier(request.barrier_id(), request.task(),
                     {request.tasks().begin(), request.tasks().end()}, absl::Now() + *timeout,
                     std::move(done));
}

// A worker's telemetry stream: each summary is committed, then acknowledged with the host's
// persisted step. One ack write is in flight at a time; newer acks of a job replace older
// queued ones, so a slow reader costs nothing but coalesced acks.
class CoordinatorServer::UploadReactor final
    : public grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck> {
 public:
  UploadReactor(CoordinatorTelemetry* telemetry, grpc::CallbackServerContext* context)
      : telemetry_(telemetry), context_(context) {
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      absl::MutexLock lock(&mu_);
      reads_done_ = true;
      FinishIfIdleLocked(grpc::Status::OK);
      return;
    }
    absl::Status caller = CheckWorkerHost(*context_, in_.host());  // a worker sends as itself
    absl::StatusOr<int64_t> persisted = caller.ok() ? telemetry_->Accept(in_) : caller;
    absl::MutexLock lock(&mu_);
    if (!persisted.ok()) {
      reads_done_ = true;
      FinishIfIdleLocked(ToGrpcStatus(persisted.status()));
      return;
    }
    pending_[in_.job_id()] = *persisted;
    WriteNextLocked();
    StartRead(&in_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) pending_.clear();  // the client is gone; its reads will end too
    WriteNextLocked();
    FinishIfIdleLocked(final_status_);
  }

  void OnDone() override { delete this; }

 private:
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || pending_.empty() || finished_) return;
    auto it = pending_.begin();
    out_.set_job_id(it->first);
    out_.set_persisted_through_step(it->second);
    pending_.erase(it);
    writing_ = true;
    StartWrite(&out_);
  }
  void FinishIfIdleLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!status.ok()) final_status_ = status;
    if (finished_ || !reads_done_ || writing_ || (!pending_.empty() && final_status_.ok())) {
      return;
    }
    finished_ = true;
    Finish(final_status_);
  }

  CoordinatorTelemetry* const telemetry_;
  grpc::CallbackServerContext* const context_;
  v1::HostSummary in_;
  absl::Mutex mu_;
  v1::UploadTelemetryAck out_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> pending_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

// A dashboard's watch: summaries from the hub's bounded per-watcher queue, one write in
// flight. Once the queue ran empty, the hub's notifier thread wakes the reactor when more
// arrive; otherwise each OnWriteDone pulls the next on gRPC's own threads.
class CoordinatorServer::WatchReactor final : public grpc::ServerWriteReactor<v1::GlobalSummary> {
 public:
  explicit WatchReactor(std::shared_ptr<telemetry::Watcher> watcher)
      : watcher_(std::move(watcher)) {
    watcher_->SetNotify([this] { Pump(); });
    Pump();
  }

  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watcher gone"));
    }
    Pump();
  }
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    if (!writing_) FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watcher cancelled"));
  }
  void OnDone() override {
    watcher_->SetNotify(nullptr);  // after this the hub never calls Pump again
    delete this;
  }

 private:
  void Pump() {
    const v1::GlobalSummary* write = nullptr;
    {
      absl::MutexLock lock(&mu_);
      if (writing_ || finished_) return;
      if (cancelled_) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      telemetry::Watcher::PopResult next = watcher_->TryPop();
      switch (next.kind) {
        case telemetry::Watcher::Kind::kItem:
          out_ = std::move(next.summary);  // shared with other watchers: never mutated
          writing_ = true;
          write = out_.get();
          break;
        case telemetry::Watcher::Kind::kEmpty:
          return;
        case telemetry::Watcher::Kind::kEnd:
          return FinishLocked(ToGrpcStatus(next.status));
      }
    }
    // Outside mu_ (gRPC takes its own locks): while writing_, nothing else touches out_ or
    // finishes the stream until OnWriteDone.
    StartWrite(write);
  }
  void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  std::shared_ptr<telemetry::Watcher> watcher_;
  absl::Mutex mu_;
  std::shared_ptr<const v1::GlobalSummary> out_ ABSL_GUARDED_BY(mu_);  // the write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

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
    return FinishUnary(context, [&] { return handler_->SubmitJob(*request, response); });
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
    return FinishUnary(context, [&] {
      RETURN_IF_ERROR(CheckWorkerHost(*context, request->host()));
      return handler_->ReportJobProgress(*request, response);
    });
  }
  grpc::ServerUnaryReactor* ReportCheckpoint(grpc::CallbackServerContext* context,
                                             const v1::ReportCheckpointRequest* request,
                                             v1::ReportCheckpointResponse* response) override {
    return FinishUnary(context, [&] {
      RETURN_IF_ERROR(CheckWorkerHost(*context, request->host()));
      return handler_->ReportCheckpoint(*request, response);
    });
  }
  grpc::ServerUnaryReactor* CheckpointJob(grpc::CallbackServerContext* context,
                                          const v1::CheckpointJobRequest* request,
                                          v1::CheckpointJobResponse* response) override {
    return FinishUnary(context, [&] { return handler_->CheckpointJob(*request, response); });
  }
  grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck>* UploadTelemetry(
      grpc::CallbackServerContext* context) override {
    return new UploadReactor(&handler_->telemetry(), context);
  }
  grpc::ServerWriteReactor<v1::GlobalSummary>* WatchTelemetry(
      grpc::CallbackServerContext*, const v1::WatchTelemetryRequest* request) override {
    absl::StatusOr<std::shared_ptr<telemetry::Watcher>> watcher =
        request->job_id().empty()
            ? absl::InvalidArgumentError("job_id is empty")
            : handler_->telemetry().hub().Subscribe(
                  {.job_id = request->job_id(),
                   .since_step = request->since_step(),
                   .names = {request->names().begin(), request->names().end()},
                   .host_detail = request->host_detail(),
                   .history_only = request->history_only()});
    if (!watcher.ok()) {
      // A reactor that only reports the refusal.
      class Refusal final : public grpc::ServerWriteReactor<v1::GlobalSummary> {
       public:
        explicit Refusal(const absl::Status& status) { Finish(ToGrpcStatus(status)); }
        void OnDone() override { delete this; }
      };
      return new Refusal(watcher.status());
    }
    return new WatchReactor(std::move(*watcher));
  }
  grpc::ServerUnaryReactor* GetMetrics(grpc::CallbackServerContext* context,
                                       const v1::GetMetricsRequest* request,
                                       v1::GetMetricsResponse* response) override {
    return FinishUnary(context, [&] { return handler_->GetMetrics(*request, response); });
  }
  grpc::ServerUnaryReactor* GetDeviceMemory(grpc::CallbackServerContext* context,
                                            const v1::GetDeviceMemoryRequest* request,
                                            v1::GetDeviceMemoryResponse* response) override {
    return FinishUnary(context, [&] { return handler_->GetDeviceMemory(*request, response); });
  }
  grpc::ServerUnaryReactor* KeyValueSet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueSetRequest* request,
                                        v1::KeyValueSetResponse* response) override {
    return FinishUnary(context, [&] { return handler_->KeyValueSet(*request, response); });
  }
  grpc::ServerUnaryReactor* KeyValueTryGet(grpc::CallbackServerContext* context,
                                           const v1::KeyValueGetRequest* request,
                                           v1::KeyValueGetResponse* response) override {
    return FinishUnary(context, [&] { return handler_->KeyValueTryGet(*request, response); });
  }
  grpc::ServerUnaryReactor* KeyValueList(grpc::CallbackServerContext* context,
                                         const v1::KeyValueListRequest* request,
                                         v1::KeyValueListResponse* response) override {
    return FinishUnary(context, [&] { return handler_->KeyValueList(*request, response); });
  }
  grpc::ServerUnaryReactor* KeyValueDelete(grpc::CallbackServerContext* context,
                                           const v1::KeyValueDeleteRequest* request,
                                           v1::KeyValueDeleteResponse* response) override {
    return FinishUnary(context, [&] { return handler_->KeyValueDelete(*request, response); });
  }
  // The waiting RPCs finish from the store's callback; the server thread returns at once.
  grpc::ServerUnaryReactor* KeyValueGet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueGetRequest* request,
                                        v1::KeyValueGetResponse* response) override {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
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
    handler_->WaitAtBarrier(*request, [reactor](absl::Status status) {
      reactor->Finish(ToGrpcStatus(status));
    });
    return reactor;
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
                                                 .admit = [r = server->registry_.get()](
                                                     const std::string& host,
                                                     const std::string& incarnation) {
                                                   // Fenced: DEAD or replaced. Unknown hosts
                                                   // (after a restart) are not.
                                                   absl::Status s = r->CheckCurrent(host, incarnation);
                                                   return absl::IsNotFound(s) ? absl::OkStatus() : s;
                                                 }}));
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
  ASSIGN_OR_RETURN(server->progress_,
                   coordinator::ProgressMonitor::Create(
                       {.hang_timeout = config.hang_timeout, .clock = config.clock}));
  server->restored_check_at_ = config.clock->Now() + 2 * config.heartbeat_timeout;
  server->launcher_ = std::make_unique<JobLauncher>(
      JobLauncher::Config{.registry = server->registry_.get(),
                          .jobs = server->jobs_.get(),
                          .cache = server->cache_.get(),
                          .runtime = server->runtime_.get(),
                          .telemetry = server->telemetry_.get(),
                          .progress = server->progress_.get(),
                          .restart_wait = config.restart_wait});
  server->handler_ = std::make_unique<CoordinatorRpcHandler>(
      server->registry_.get(), server->kv_.get(), server->jobs_.get(), server->launcher_.get(),
      server->telemetry_.get());
  server->service_ = std::make_unique<Service>(server->handler_.get());
  ASSIGN_OR_RETURN(StartedServer started,
                   StartGrpcServer("listen", config.listen, {server->service_.get()}));
  server->server_ = std::move(started.server);
  server->port_ = started.port;
  server->sweeper_ = std::thread([s = server.get()] { s->SweepLiveness(); });
  if (!config.http_listen.empty()) {
    ASSIGN_OR_RETURN(server->dashboard_,
                     DashboardApi::Create({.handler = server->handler_.get(),
                                           .history = &server->telemetry_->history()}));
    ASSIGN_OR_RETURN(server->http_, HttpServer::Start({.listen = config.http_listen,
                                                       .web_root = config.web_root,
                                                       .api = server->dashboard_.get()}));
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
    CheckRestoredJobs();
  }
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
  stop_sweeper_.Notify();
  sweeper_.join();
}

CoordinatorServer::~CoordinatorServer() { Drain(absl::ZeroDuration()); }

}  // namespace meshrun::services
