#include "worker_service/worker_server.h"

#include <spdlog/spdlog.h>
#include <algorithm>
#include <filesystem>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/protocol.h"
#include "common/status_macros.h"
#include "rpc/proto_convert.h"
#include "rpc/server_support.h"
#include "rpc/unary_reactor.h"
#include "runtime/compile_options.h"
#include "runtime/runtime_setup.h"
#include "worker_service/coordinator_kv_client.h"
#include "worker_service/memory_checkpoint_transfer.h"
#include "worker_service/worker_checkpoints.h"

namespace meshrun::services {
class WorkerServer::Service final : public v1::Worker::CallbackService {
 public:
  explicit Service(WorkerServer* owner) : owner_(owner) {}

  grpc::ServerUnaryReactor* GetSupportedVersions(
      grpc::CallbackServerContext* context, const v1::GetWorkerSupportedVersionsRequest*,
      v1::SupportedVersions* response) override {
    return FinishUnary(context, [&] {
      response->set_min_version(kProtocolMinVersion);
      response->set_max_version(kProtocolMaxVersion);
      return absl::OkStatus();
    });
  }

  grpc::ServerUnaryReactor* GetStatus(grpc::CallbackServerContext* context,
                                      const v1::GetStatusRequest*,
                                      v1::WorkerStatusReport* response) override {
    return FinishUnary(context, [&] {
      owner_->FillStatus(response);
      return absl::OkStatus();
    });
  }
  grpc::ServerUnaryReactor* GetDeviceMemory(grpc::CallbackServerContext* context,
                                            const v1::WorkerDeviceMemoryRequest* request,
                                            v1::WorkerDeviceMemoryResponse* response) override {
    return FinishUnary(context, [&] { return owner_->DeviceMemory(*request, response); });
  }
  grpc::ServerUnaryReactor* StartJob(grpc::CallbackServerContext* context,
                                     const v1::StartJobRequest* request,
                                     v1::StartJobResponse*) override {
    // Reads executables and data from disk, loads programs, may wait for an earlier run's
    // end: off the callback thread.
    return FinishUnaryOffThread(context, owner_->slow_calls_,
                                [this, request] { return owner_->StartJob(*request); });
  }
  grpc::ServerUnaryReactor* StopJob(grpc::CallbackServerContext* context,
                                    const v1::StopJobRequest* request,
                                    v1::StopJobResponse*) override {
    return FinishUnary(context, [&] { return owner_->StopJob(*request); });
  }
  grpc::ServerUnaryReactor* CheckpointNow(grpc::CallbackServerContext* context,
                                          const v1::CheckpointNowRequest* request,
                                          v1::CheckpointNowResponse*) override {
    return FinishUnary(context, [&] { return owner_->CheckpointNow(*request); });
  }
  grpc::ServerUnaryReactor* Drain(grpc::CallbackServerContext* context, const v1::DrainRequest*,
                                  v1::DrainResponse*) override {
    return FinishUnary(context, [&] {
      if (!owner_->config_.on_drain_request) {
        return absl::FailedPreconditionError(
            "this worker takes no drain requests; stop its process (SIGTERM) instead");
      }
      spdlog::info("the coordinator asks this worker to drain");
      owner_->config_.on_drain_request();
      return absl::OkStatus();
    });
  }
  grpc::ServerWriteReactor<v1::MemoryCheckpointPiece>* FetchMemoryCheckpoint(
      grpc::CallbackServerContext*, const v1::FetchMemoryCheckpointRequest* request) override {
    return ServeMemoryCheckpoint(
        owner_->memory_checkpoints_.Copies(request->job_id(), request->step()), *request);
  }
  grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck>* RelayTelemetry(
      grpc::CallbackServerContext* context) override {
    return owner_->relay_->Serve(context);
  }
  grpc::ServerReadReactor<v1::LoadExecutableChunk>* LoadExecutable(
      grpc::CallbackServerContext*, v1::LoadExecutableResponse* response) override;
  grpc::ServerWriteReactor<v1::LoadExecutableChunk>* CompileProgram(
      grpc::CallbackServerContext*, const v1::CompileProgramRequest* request) override;

 private:
  WorkerServer* const owner_;
};

// Receives one executable: chunks go straight into an ExecutableStore upload, so nothing is
// visible until the whole artifact arrived and was checked. The upload checks (crc32c or
// sha256) and writes on its own thread while the next chunks arrive.
//
// When the sha256 is checked (bench/README.md, "Integrity of executable transfers"): from an
// authenticated TLS peer, or when the chunks carry a crc32c (a plaintext link), only on load
// (Verify::kOnRead); from a plaintext sender without crc32c, also on receive.
class WorkerServer::LoadReactor final : public grpc::ServerReadReactor<v1::LoadExecutableChunk> {
 public:
  LoadReactor(WorkerServer* owner, grpc::CallbackServerContext* context,
              v1::LoadExecutableResponse* response, bool authenticated)
      : owner_(owner),
        response_(response),
        authenticated_(authenticated),
        idle_(owner->idle_uploads_->Watch([context] { context->TryCancel(); })) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    idle_->Touch();  // limits: --upload_idle_timeout
    if (!ok) {  // the commit waits for the upload's writer (the disk): off this thread
      owner_->slow_calls_.Run([this] { Complete(); });
      return;
    }
    absl::Status status = Accept();
    if (!status.ok()) {
      upload_.reset();
      return Finish(ToGrpcStatus(status));
    }
    // Reads on while the upload has room; otherwise its writer thread resumes reading, so this
    // gRPC thread never waits for the disk.
    if (upload_->HasRoomOrNotify([this] { StartRead(&chunk_); })) StartRead(&chunk_);
  }
  void OnDone() override { delete this; }

 private:
  absl::Status Accept() {
    if (upload_ == nullptr) {
      if (owner_->executables_->Has(chunk_.fingerprint())) {
        return absl::AlreadyExistsError("executable already held");
      }
      crc_ = chunk_.has_crc32c();
      const auto verify = authenticated_ || crc_ ? worker::ExecutableStore::Verify::kOnRead
                                                 : worker::ExecutableStore::Verify::kOnReceive;
      ASSIGN_OR_RETURN(upload_, owner_->executables_->Begin(chunk_.fingerprint(),
                                                            chunk_.total_bytes(), verify));
      fingerprint_ = chunk_.fingerprint();
    } else if (crc_ && !chunk_.has_crc32c()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk at offset ", chunk_.offset(),
          " carries no crc32c; the first chunk did, so every chunk must"));
    }
    // The chunk's bytes go to the upload's writer thread; chunk_ gets a used buffer back.
    RETURN_IF_ERROR(upload_->Append(
        chunk_.offset(), chunk_.mutable_data(),
        chunk_.has_crc32c() ? std::optional<uint32_t>(chunk_.crc32c()) : std::nullopt));
    if (!chunk_.sha256().empty()) sha256_ = chunk_.sha256();
    return absl::OkStatus();
  }

  void Complete() {
    if (upload_ == nullptr) {
      return Finish(ToGrpcStatus(absl::InvalidArgumentError("no chunks received")));
    }
    absl::Status status = upload_->Commit(sha256_);
    if (status.ok()) {
      response_->set_fingerprint(fingerprint_);
      response_->set_bytes_received(upload_->received());
      spdlog::info("loaded executable {} ({} bytes)", fingerprint_.substr(0, 12),
                   upload_->received());
    } else {
      spdlog::warn("rejected executable {}: {}", fingerprint_.substr(0, 12), status.ToString());
    }
    upload_.reset();
    Finish(ToGrpcStatus(status));
  }

  WorkerServer* const owner_;
  v1::LoadExecutableResponse* const response_;
  const bool authenticated_;  // a TLS peer: its records are authenticated
  bool crc_ = false;          // the first chunk carried a crc32c
  v1::LoadExecutableChunk chunk_;
  std::unique_ptr<worker::ExecutableStore::Upload> upload_;
  std::string fingerprint_;
  std::string sha256_;
  std::unique_ptr<IdleWatchdog::Lease> idle_;
};

grpc::ServerReadReactor<v1::LoadExecutableChunk>* WorkerServer::Service::LoadExecutable(
    grpc::CallbackServerContext* context, v1::LoadExecutableResponse* response) {
  const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
  return new LoadReactor(owner_, context, response,
                         auth != nullptr && auth->IsPeerAuthenticated());
}

// Compiles on a thread of the worker's slow calls, not gRPC's (a coordinator asks once per
// cache key), then streams the executable with one write in flight.
class WorkerServer::CompileReactor final
    : public grpc::ServerWriteReactor<v1::LoadExecutableChunk> {
 public:
  // `request` stays valid until the reactor finished.
  CompileReactor(WorkerServer* owner, const v1::CompileProgramRequest* request) {
    owner->slow_calls_.Run([this, owner, request] {
      absl::StatusOr<std::string> bytes = owner->CompileProgram(*request);
      if (!bytes.ok()) {
        Finish(ToGrpcStatus(bytes.status()));
        return;
      }
      bytes_ = *std::move(bytes);
      sha256_ = Sha256Hex(bytes_);
      WriteNext();
    });
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (offset_ >= bytes_.size()) return Finish(grpc::Status::OK);
    const size_t n = std::min<size_t>(worker::ExecutableStore::kMaxChunkBytes,
                                      bytes_.size() - offset_);
    chunk_.Clear();
    if (offset_ == 0) {
      chunk_.set_fingerprint(sha256_);
      chunk_.set_total_bytes(static_cast<int64_t>(bytes_.size()));
    }
    chunk_.set_offset(static_cast<int64_t>(offset_));
    chunk_.set_data(bytes_.substr(offset_, n));
    offset_ += n;
    if (offset_ == bytes_.size()) chunk_.set_sha256(sha256_);
    StartWrite(&chunk_);
  }

  std::string bytes_;
  std::string sha256_;
  size_t offset_ = 0;
  v1::LoadExecutableChunk chunk_;
};

grpc::ServerWriteReactor<v1::LoadExecutableChunk>* WorkerServer::Service::CompileProgram(
    grpc::CallbackServerContext*, const v1::CompileProgramRequest* request) {
  return new CompileReactor(owner_, request);
}

absl::StatusOr<std::string> WorkerServer::CompileProgram(const v1::CompileProgramRequest& request) {
  if (runtime_ == nullptr) {
    return absl::FailedPreconditionError(
        "this worker has no runtime to compile with; start meshrun-worker with --pjrt_plugin");
  }
  ASSIGN_OR_RETURN(runtime::ProgramSignature signature, SignatureOf(request.program()));
  // security: what reaches the compiler is rebuilt from the fields a job may set, whoever sent it.
  ASSIGN_OR_RETURN(const std::string options, runtime::RebuildClientCompileOptions(
                                                  request.compile_options(), "compile_options"));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Executable> executable,
                   runtime_->Compile({.code = request.program().stablehlo(),
                                      .format = "mlir",
                                      .compile_options = options,
                                      .signature = std::move(signature)}));
  metrics_.AddTime(worker::kCompileTime, absl::Now() - start);
  ASSIGN_OR_RETURN(std::string bytes, runtime_->Serialize(*executable));
  // Kept here too, so the coordinator need not send this worker what it just made.
  const std::string fingerprint = Sha256Hex(bytes);
  if (!executables_->Has(fingerprint)) {
    ASSIGN_OR_RETURN(auto upload, executables_->Begin(fingerprint, static_cast<int64_t>(bytes.size())));
    for (size_t offset = 0; offset < bytes.size(); offset += worker::ExecutableStore::kMaxChunkBytes) {
      RETURN_IF_ERROR(upload->Append(static_cast<int64_t>(offset),
                                     absl::string_view(bytes).substr(
                                         offset, worker::ExecutableStore::kMaxChunkBytes)));
    }
    RETURN_IF_ERROR(upload->Commit(fingerprint));
  }
  spdlog::info("compiled program {} for the coordinator: executable {} ({} bytes, {})",
               request.program().role(), fingerprint.substr(0, 12), bytes.size(),
               absl::FormatDuration(absl::Now() - start));
  return bytes;
}

WorkerServer::WorkerServer(Config config)
    : config_(std::move(config)), incarnation_(FreshIncarnation()) {}

std::string WorkerServer::incarnation() const {
  absl::MutexLock lock(&mu_);
  return incarnation_;
}

absl::StatusOr<std::unique_ptr<WorkerServer>> WorkerServer::Start(Config config) {
  ASSIGN_OR_RETURN(HostPort listen, ParseHostPort("listen", config.listen));
  RETURN_IF_ERROR(ParseHostPort("coordinator", config.coordinator).status());
  if (!config.advertise_address.empty()) {
    RETURN_IF_ERROR(ParseHostPort("advertise_address", config.advertise_address).status());
  }
  RETURN_IF_ERROR(PrepareStateDir("state_dir", config.state_dir));
  ASSIGN_OR_RETURN(PathRoots data_roots,
                   PathRoots::FromFlag(config.data_roots,
                                       {std::filesystem::absolute(config.state_dir).string()}));
  std::unique_ptr<WorkerServer> server(new WorkerServer(std::move(config)));
  server->data_roots_ = std::move(data_roots);
  server->uploader_ = std::make_unique<TelemetryUploader>(
      TelemetryUploader::Config{.coordinator = server->config_.coordinator});
  server->relay_ = std::make_unique<TelemetryRelay>(
      TelemetryRelay::Config{.coordinator = MakeCoordinatorChannel(server->config_.coordinator)});
  ASSIGN_OR_RETURN(server->executables_,
                   worker::ExecutableStore::Create(
                       server->config_.state_dir + "/executables",
                       {.max_bytes = server->config_.executable_store_bytes}));
  server->idle_uploads_ = std::make_unique<IdleWatchdog>(server->config_.upload_idle_timeout);
  server->kv_client_ = std::make_shared<CoordinatorKeyValueClient>(
      MakeCoordinatorChannel(server->config_.coordinator));
  if (!server->config_.pjrt_plugin.empty()) {
    ASSIGN_OR_RETURN(server->runtime_,
                     CreatePjrtRuntime(server->config_.pjrt_plugin, server->config_.cpu_devices,
                                       server->kv_client_));
  }
  server->service_ = std::make_unique<Service>(server.get());
  ASSIGN_OR_RETURN(StartedServer started,
                   StartGrpcServer("listen", server->config_.listen, {server->service_.get()}));
  server->server_ = std::move(started.server);
  server->port_ = started.port;
  if (server->config_.advertise_address.empty()) {
    const bool wildcard = listen.host == "0.0.0.0" || listen.host == "::";
    const std::string host = wildcard ? server->config_.identity.host : listen.host;
    server->advertise_address_ = host.find(':') != std::string::npos
                                     ? absl::StrCat("[", host, "]:", server->port_)
                                     : absl::StrCat(host, ":", server->port_);
  } else {
    server->advertise_address_ = server->config_.advertise_address;
  }
  server->coordinator_ =
      v1::Coordinator::NewStub(MakeCoordinatorChannel(server->config_.coordinator));
  server->heartbeats_ = std::make_unique<HeartbeatSender>(server->coordinator_.get());
  server->loop_ = std::thread([s = server.get()] { s->RegistrationLoop(); });
  spdlog::info("worker {} listening on port {} (advertised as {}), coordinator {}",
               server->config_.identity.host, server->port_, server->advertise_address_,
               server->config_.coordinator);
  return server;
}

void WorkerServer::Drain(absl::Duration deadline) {
  if (drained_.exchange(true) || server_ == nullptr) return;  // null: Start() failed
  drain_until_micros_ = absl::ToUnixMicros(absl::Now() + deadline);  // every step below ends by then
  // Ends between steps; reported as CANCELLED. A job with checkpoints saves a step first (a
  // preemption loses no step), within the drain deadline: the step the coordinator picked for
  // every host of the job, or, when it cannot be asked, the step this host finishes.
  PreemptRunningJob();
  WaitForJobEnd(deadline);
  std::unique_ptr<RunningJob> job;
  {
    absl::MutexLock lock(&job_mu_);
    job = std::move(job_);
  }
  if (job != nullptr) job->loop->Stop();
  reporters_.JoinAll();
  uploader_.reset();  // stops its stream; what was not acknowledged is lost with the process
  stop_loop_.Notify();
  heartbeats_->Stop();
  loop_.join();
  if (registered_) {
    v1::DeregisterWorkerRequest request;
    request.set_host(config_.identity.host);
    request.set_incarnation(incarnation());
    v1::DeregisterWorkerResponse response;
    auto context = ContextWithTimeout(std::min(config_.rpc_timeout, DrainLeft()));
    grpc::Status status = coordinator_->DeregisterWorker(context.get(), request, &response);
    if (!status.ok()) spdlog::warn("deregistration failed: {}", status.error_message());
    registered_ = false;
  }
  // Member streams last as long as their jobs: ended now, their hosts upload to the
  // coordinator, and the server's drain does not wait for them.
  relay_->Stop();
  DrainServer(*server_, DrainLeft());
  slow_calls_.JoinAll();  // they finish their calls, then the server may go
}

// A second, so that an in-process server going away (tests, embedders) still deregisters: a
// worker left ALIVE on the coordinator holds its host name until its heartbeats time out.
WorkerServer::~WorkerServer() { Drain(absl::Seconds(1)); }

void WorkerServer::WaitForJobEnd(absl::Duration deadline) {
  const absl::Time until = absl::Now() + deadline;
  while (absl::Now() < until) {
    {
      absl::MutexLock lock(&job_mu_);
      if (job_ == nullptr || job_->loop->result().has_value()) return;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void WorkerServer::PreemptRunningJob() {
  v1::PreemptJobRequest request;
  {
    absl::MutexLock lock(&job_mu_);
    if (job_ == nullptr) return;
    if (job_->checkpoints == nullptr || job_->loop->result().has_value()) {
      job_->loop->RequestCheckpoint(/*then_stop=*/true);  // no policy: a plain Cancel
      return;
    }
    request.set_job_id(job_->job_id);
    request.set_attempt(job_->attempt);
  }
  request.set_host(config_.identity.host);
  request.set_incarnation(incarnation());
  // The coordinator asks every host of the job (this one too) to save the step it picks and
  // stop: a multi-host job's commit needs all of them, and a host cannot save a step it passed.
  v1::PreemptJobResponse response;
  auto context = ContextWithTimeout(std::min(config_.rpc_timeout, std::max(DrainLeft() / 2,
                                                                            absl::Seconds(1))));
  const grpc::Status status = coordinator_->PreemptJob(context.get(), request, &response);
  absl::MutexLock lock(&job_mu_);
  if (job_ == nullptr || job_->job_id != request.job_id()) return;
  if (status.ok()) {
    spdlog::info("job {}: preempted; every host saves step {} and stops", request.job_id(),
                 response.step() == 0 ? "the current" : std::to_string(response.step()));
    // Normally set already by the coordinator's CheckpointNow; an error means it was reached.
    // Step 0: a one-host job, saved after the current step.
    if (response.step() == 0) {
      job_->loop->RequestCheckpoint(/*then_stop=*/true);
    } else {
      job_->loop->RequestCheckpointAt(response.step(), /*then_stop=*/true).IgnoreError();
    }
    return;
  }
  spdlog::warn("job {}: the coordinator did not take the preemption ({}); saving this host's "
               "next step alone", request.job_id(), status.error_message());
  job_->loop->RequestCheckpoint(/*then_stop=*/true);
}

absl::Status WorkerServer::CheckpointNow(const v1::CheckpointNowRequest& request) {
  absl::MutexLock lock(&job_mu_);
  if (job_ == nullptr || job_->job_id != request.job_id() || job_->loop->result().has_value()) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " does not run here"));
  }
  if (job_->checkpoints == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", request.job_id(), " has no checkpoint policy"));
  }
  if (request.step() > 0) {
    return job_->loop->RequestCheckpointAt(request.step(), request.then_stop());
  }
  job_->loop->RequestCheckpoint(request.then_stop());
  return absl::OkStatus();
}

absl::Status WorkerServer::StopJob(const v1::StopJobRequest& request) {
  absl::MutexLock lock(&job_mu_);
  if (job_ == nullptr || job_->job_id != request.job_id()) {
    return absl::NotFoundError(absl::StrCat("job ", request.job_id(), " does not run here"));
  }
  job_->loop->Cancel();
  return absl::OkStatus();
}

void WorkerServer::ReportOutcome(const std::string& job_id, int attempt,
                                 const worker::LoopResult& result) {
  v1::ReportJobProgressRequest request;
  request.set_job_id(job_id);
  request.set_attempt(attempt);
  request.set_host(config_.identity.host);
  request.set_incarnation(incarnation());
  request.set_last_step(result.last_completed_step);
  switch (result.outcome) {
    case worker::LoopOutcome::kSucceeded: request.set_state(v1::JOB_STATE_SUCCEEDED); break;
    case worker::LoopOutcome::kCancelled: request.set_state(v1::JOB_STATE_CANCELLED); break;
    case worker::LoopOutcome::kFailed:
      request.set_state(v1::JOB_STATE_FAILED);
      request.set_error(std::string(result.error.message()));
      request.set_restore_failed(result.restore_failed);
      request.set_nonfinite(result.nonfinite);
      break;
  }
  spdlog::info("job {} ended {} after step {}{}", job_id, worker::LoopOutcomeName(result.outcome),
               result.last_completed_step,
               result.error.ok() ? "" : ": " + std::string(result.error.message()));
  // The job's last summaries go before its outcome: the coordinator stops collecting then.
  if (!uploader_->Flush(job_id, std::min(absl::Seconds(10), DrainLeft()))) {
    spdlog::warn("job {}: telemetry not all acknowledged before reporting the outcome", job_id);
  }
  // The outcome must not be lost to an outage or a busy coordinator: a restarted one still knows
  // the job and waits for it, so retry while it is unreachable or busy, until this worker drains.
  absl::Duration backoff = absl::Seconds(1);
  // Draining: retries stop at the drain deadline (one attempt is always made, of 1 s at least).
  for (int attempt = 0;
       !stop_loop_.HasBeenNotified() && (attempt == 0 || DrainLeft() > absl::ZeroDuration());
       ++attempt) {
    v1::ReportJobProgressResponse response;
    auto context = ContextWithTimeout(
        std::min(config_.rpc_timeout, std::max(DrainLeft(), absl::Seconds(1))));
    grpc::Status status = coordinator_->ReportJobProgress(context.get(), request, &response);
    if (!RetryLater(status)) {  // busy (RESOURCE_EXHAUSTED) is retried: the outcome must land
      if (!status.ok()) spdlog::warn("job {}: report refused: {}", job_id, status.error_message());
      return;
    }
    if (attempt % 10 == 0) {
      spdlog::warn("job {}: cannot report the outcome yet ({}); retrying", job_id,
                   status.error_message());
    }
    stop_loop_.WaitForNotificationWithTimeout(std::min(backoff, DrainLeft()));
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

absl::Status WorkerServer::DeviceMemory(const v1::WorkerDeviceMemoryRequest& request,
                                        v1::WorkerDeviceMemoryResponse* response) {
  if (runtime_ == nullptr) return absl::FailedPreconditionError("this worker has no runtime");
  std::vector<std::string> names;
  if (!request.runtime_name().empty()) {
    names.push_back(request.runtime_name());
  } else {
    for (const auto& device : runtime_->addressable_devices()) names.push_back(device.runtime_name);
  }
  for (const std::string& name : names) {
    ASSIGN_OR_RETURN(runtime::MemoryStats stats, runtime_->GetMemoryStats(name));
    v1::DeviceMemory* memory = response->add_devices();
    memory->set_runtime_name(stats.runtime_name);
    if (stats.bytes_in_use) memory->set_bytes_in_use(*stats.bytes_in_use);
    if (stats.peak_bytes_in_use) memory->set_peak_bytes_in_use(*stats.peak_bytes_in_use);
    if (stats.bytes_limit) memory->set_bytes_limit(*stats.bytes_limit);
    memory->set_unreported_reason(stats.unreported_reason);
  }
  return absl::OkStatus();
}

void WorkerServer::FillStatus(v1::WorkerStatusReport* report) {
  report->set_host(config_.identity.host);
  report->set_incarnation(incarnation());
  if (runtime_ != nullptr) {
    *report->mutable_runtime() = ToProto(runtime_->identity());
    for (const auto& device : runtime_->addressable_devices()) *report->add_devices() = ToProto(device);
  }
  for (const std::string& fp : executables_->Fingerprints()) report->add_executable_fingerprints(fp);
  {
    absl::MutexLock lock(&job_mu_);
    if (job_ != nullptr && !job_->loop->result().has_value()) {  // an ended job runs no more
      report->set_running_job_id(job_->job_id);
      report->set_current_step(job_->loop->last_completed_step());
    }
  }
  for (const auto& snapshot : memory_checkpoints_.Held()) {
    v1::MemoryCheckpointHeld* held = report->add_memory_checkpoints();
    held->set_job_id(snapshot->job_id);
    held->set_step(snapshot->step);
    held->set_data_position(snapshot->data_position);
    held->set_bytes(snapshot->Bytes());
    held->set_of_host(snapshot->of_host);
  }
  for (const worker::MetricValue& m : metrics_.Snapshot()) {
    v1::Metric* metric = report->add_metrics();
    metric->set_name(m.name);
    metric->set_count(m.count);
    metric->set_total(m.total);
    metric->set_unit(m.unit());
  }
}

}  // namespace meshrun::services
