#include "services/worker_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/protocol.h"
#include "common/status_macros.h"
#include "coordinator/job_validation.h"
#include "coordinator/progress_monitor.h"
#include "services/server_support.h"
#include "services/worker_checkpoints.h"
#include "services/coordinator_kv_client.h"
#include "services/proto_convert.h"
#include "services/runtime_setup.h"
#include "services/unary_reactor.h"
#include "telemetry/combine.h"
#include "worker/batch_sources.h"
#include "worker/collectives/host_replicas.h"
#include "worker/runtime/example_job.h"
#include "worker/sparse/plan_batches.h"

namespace meshrun::services {
namespace {

std::string FreshIncarnation() {
  absl::BitGen gen;
  return absl::StrFormat("%016x%016x", absl::Uniform<uint64_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

}  // namespace

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
    return FinishUnary(context, [&] { return owner_->StartJob(*request); });
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
  grpc::ServerReadReactor<v1::LoadExecutableChunk>* LoadExecutable(
      grpc::CallbackServerContext*, v1::LoadExecutableResponse* response) override;
  grpc::ServerWriteReactor<v1::LoadExecutableChunk>* CompileProgram(
      grpc::CallbackServerContext*, const v1::CompileProgramRequest* request) override;

 private:
  WorkerServer* const owner_;
};

// Receives one executable: chunks go straight into an ExecutableStore upload, so nothing is
// visible until the whole artifact arrived and matched its sha256. The upload hashes and
// writes on its own thread while the next chunks arrive.
class WorkerServer::LoadReactor final : public grpc::ServerReadReactor<v1::LoadExecutableChunk> {
 public:
  LoadReactor(WorkerServer* owner, v1::LoadExecutableResponse* response)
      : owner_(owner), response_(response) {
    StartRead(&chunk_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return Complete();
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
      ASSIGN_OR_RETURN(upload_, owner_->executables_->Begin(chunk_.fingerprint(),
                                                            chunk_.total_bytes()));
      fingerprint_ = chunk_.fingerprint();
    }
    // The chunk's bytes go to the upload's writer thread; chunk_ gets a used buffer back.
    RETURN_IF_ERROR(upload_->Append(chunk_.offset(), chunk_.mutable_data()));
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
  v1::LoadExecutableChunk chunk_;
  std::unique_ptr<worker::ExecutableStore::Upload> upload_;
  std::string fingerprint_;
  std::string sha256_;
};

grpc::ServerReadReactor<v1::LoadExecutableChunk>* WorkerServer::Service::LoadExecutable(
    grpc::CallbackServerContext*, v1::LoadExecutableResponse* response) {
  return new LoadReactor(owner_, response);
}

// Compiles on the calling gRPC thread (a coordinator asks once per cache key), then streams
// the executable with one write in flight.
class WorkerServer::CompileReactor final
    : public grpc::ServerWriteReactor<v1::LoadExecutableChunk> {
 public:
  CompileReactor(WorkerServer* owner, const v1::CompileProgramRequest& request) {
    absl::StatusOr<std::string> bytes = owner->CompileProgram(request);
    if (!bytes.ok()) {
      Finish(ToGrpcStatus(bytes.status()));
      return;
    }
    bytes_ = *std::move(bytes);
    sha256_ = Sha256Hex(bytes_);
    WriteNext();
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
  return new CompileReactor(owner_, *request);
}

absl::StatusOr<std::string> WorkerServer::CompileProgram(const v1::CompileProgramRequest& request) {
  if (runtime_ == nullptr) {
    return absl::FailedPreconditionError(
        "this worker has no runtime to compile with; start meshrun-worker with --pjrt_plugin");
  }
  ASSIGN_OR_RETURN(runtime::ProgramSignature signature, SignatureOf(request.program()));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Executable> executable,
                   runtime_->Compile({.code = request.program().stablehlo(),
                                      .format = "mlir",
                                      .compile_options = request.compile_options(),
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
  std::unique_ptr<WorkerServer> server(new WorkerServer(std::move(config)));
  server->uploader_ = std::make_unique<TelemetryUploader>(
      TelemetryUploader::Config{.coordinator = server->config_.coordinator});
  ASSIGN_OR_RETURN(server->executables_,
                   worker::ExecutableStore::Create(server->config_.state_dir + "/executables"));
  server->kv_client_ =
      std::make_shared<CoordinatorKeyValueClient>(MakeChannel(server->config_.coordinator));
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
  server->coordinator_ = v1::Coordinator::NewStub(MakeChannel(server->config_.coordinator));
  server->loop_ = std::thread([s = server.get()] { s->RegistrationLoop(); });
  spdlog::info("worker {} listening on port {} (advertised as {}), coordinator {}",
               server->config_.identity.host, server->port_, server->advertise_address_,
               server->config_.coordinator);
  return server;
}

absl::Status WorkerServer::Register() {
  v1::RegisterWorkerRequest request;
  v1::WorkerRegistration* registration = request.mutable_registration();
  registration->mutable_protocol()->set_version(kProtocolVersion);
  registration->set_host(config_.identity.host);
  registration->set_address(advertise_address_);
  registration->set_slice_id(config_.identity.slice_id);
  registration->set_num_slices(config_.identity.num_slices);
  registration->set_worker_index(config_.identity.worker_index);
  for (const std::string& name : config_.identity.slice_hostnames) {
    registration->add_slice_hostnames(name);
  }
  registration->set_incarnation(incarnation());
  if (runtime_ != nullptr) {
    *registration->mutable_runtime() = ToProto(runtime_->identity());
    for (const auto& device : runtime_->addressable_devices()) {
      *registration->add_devices() = ToProto(device);
    }
  }
  for (const std::string& fp : executables_->Fingerprints()) {
    registration->add_executable_fingerprints(fp);
  }
  v1::RegisterWorkerResponse response;
  auto context = ContextWithTimeout(config_.rpc_timeout);
  RETURN_IF_ERROR(FromGrpcStatus(coordinator_->RegisterWorker(context.get(), request, &response)));
  heartbeat_interval_millis_ = std::max<int64_t>(1, response.heartbeat_interval_millis());
  return absl::OkStatus();
}

absl::Status WorkerServer::Heartbeat() {
  v1::HeartbeatRequest request;
  request.set_host(config_.identity.host);
  request.set_incarnation(incarnation());
  {
    absl::MutexLock lock(&job_mu_);
    if (job_ != nullptr && !job_->loop->result().has_value()) {  // progress, for hang detection
      request.set_job_id(job_->job_id);
      request.set_last_completed_step(job_->loop->last_completed_step());
      request.set_phase(in_allreduce_ ? coordinator::kPhaseGradientAllReduce : "compute");
    }
  }
  v1::HeartbeatResponse response;
  auto context = ContextWithTimeout(config_.rpc_timeout);
  return FromGrpcStatus(coordinator_->Heartbeat(context.get(), request, &response));
}

void WorkerServer::RegistrationLoop() {
  absl::Duration backoff = absl::Milliseconds(100);
  int failures = 0;
  while (!stop_loop_.HasBeenNotified()) {
    absl::Duration wait;
    if (!registered_) {
      absl::Status status = Register();
      if (status.ok()) {
        registered_ = true;
        failures = 0;
        backoff = absl::Milliseconds(100);
        spdlog::info("registered with coordinator {} as incarnation {}", config_.coordinator,
                     incarnation());
        wait = absl::Milliseconds(heartbeat_interval_millis_.load());
      } else {
        // Log the first failure and then every tenth, so a long outage does not flood logs.
        if (failures++ % 10 == 0) {
          spdlog::warn("cannot register with coordinator {}: {} (retrying)", config_.coordinator,
                       status.ToString());
        }
        if (status.code() == absl::StatusCode::kAlreadyExists) {
          absl::MutexLock lock(&mu_);
          incarnation_ = FreshIncarnation();
        }
        wait = backoff;
        backoff = std::min(backoff * 2, absl::Seconds(5));
      }
    } else {
      absl::Status status = Heartbeat();
      if (absl::IsFailedPrecondition(status)) {
        // Declared dead (fenced): whatever this incarnation ran is no longer ours to finish.
        // (NOT_FOUND is a restarted coordinator, which resumes the running job: keep it.)
        absl::MutexLock lock(&job_mu_);
        if (job_ != nullptr && !job_->loop->result().has_value()) {
          spdlog::warn("declared dead by the coordinator; stopping job {}", job_->job_id);
          job_->loop->Cancel();
        }
      }
      if (absl::IsNotFound(status)) {
        spdlog::warn("coordinator forgot this worker ({}); registering again", status.ToString());
        registered_ = false;
      } else if (absl::IsFailedPrecondition(status)) {
        absl::MutexLock lock(&mu_);
        incarnation_ = FreshIncarnation();
        spdlog::warn("{}; registering as fresh incarnation {}", status.ToString(), incarnation_);
        registered_ = false;
      } else if (!status.ok()) {
        spdlog::warn("heartbeat failed: {}", status.ToString());
      }
      wait = registered_ ? absl::Milliseconds(heartbeat_interval_millis_.load()) : absl::ZeroDuration();
    }
    stop_loop_.WaitForNotificationWithTimeout(wait);
  }
}

void WorkerServer::Drain(absl::Duration deadline) {
  if (drained_.exchange(true) || server_ == nullptr) return;  // null: Start() failed
  {
    // Ends between steps; reported as CANCELLED. A job with checkpoints saves the step it
    // finishes first (a preemption loses no step), within the drain deadline.
    absl::MutexLock lock(&job_mu_);
    if (job_ != nullptr) job_->loop->RequestCheckpoint(/*then_stop=*/true);
  }
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
  loop_.join();
  if (registered_) {
    v1::DeregisterWorkerRequest request;
    request.set_host(config_.identity.host);
    request.set_incarnation(incarnation());
    v1::DeregisterWorkerResponse response;
    auto context = ContextWithTimeout(std::min(config_.rpc_timeout, deadline));
    grpc::Status status = coordinator_->DeregisterWorker(context.get(), request, &response);
    if (!status.ok()) spdlog::warn("deregistration failed: {}", status.error_message());
    registered_ = false;
  }
  DrainServer(*server_, deadline);
}

WorkerServer::~WorkerServer() { Drain(absl::ZeroDuration()); }

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

namespace {

absl::StatusOr<std::shared_ptr<const runtime::Executable>> LoadProgram(
    runtime::Runtime& runtime, worker::ExecutableStore& store, worker::Metrics& metrics,
    const v1::JobManifest& manifest, const std::string& role) {
  auto fp = manifest.program_fingerprints().find(role);
  if (fp == manifest.program_fingerprints().end()) {
    return absl::InvalidArgumentError(absl::StrCat("manifest has no \"", role, "\" executable"));
  }
  const v1::Program* program = nullptr;
  for (const v1::Program& p : manifest.spec().programs()) {
    if (p.role() == role) program = &p;
  }
  if (program == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("spec has no \"", role, "\" program"));
  }
  ASSIGN_OR_RETURN(runtime::ProgramSignature signature, SignatureOf(*program));
  ASSIGN_OR_RETURN(std::string bytes, store.Read(fp->second));
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::unique_ptr<runtime::Executable> executable,
                   runtime.DeserializeAndLoad(bytes, std::move(signature)));
  metrics.AddTime(worker::kLoadTime, absl::Now() - start);
  return std::shared_ptr<const runtime::Executable>(std::move(executable));
}

const v1::Program* FindProgram(const v1::JobSpec& spec, const std::string& role) {
  for (const v1::Program& p : spec.programs()) {
    if (p.role() == role) return &p;
  }
  return nullptr;
}

// This host's place among a job's host replicas (docs/multihost_cpu.md): its index and their
// count; {0, 1} for a job on one host or one SPMD program over several.
struct Replica {
  int index = 0;
  int count = 1;
};
absl::StatusOr<Replica> ReplicaOf(const v1::MeshAssignment& mesh, const std::string& host) {
  if (mesh.replica_hosts_size() <= 1) return Replica{};
  for (int i = 0; i < mesh.replica_hosts_size(); ++i) {
    if (mesh.replica_hosts(i) == host) return Replica{i, mesh.replica_hosts_size()};
  }
  return absl::FailedPreconditionError(
      absl::StrCat("this host (", host, ") is not one of the job's replica hosts: ",
                   absl::StrJoin(mesh.replica_hosts(), ", ")));
}

// Replica `replica.index`'s block of the rows of a global batch array.
absl::StatusOr<runtime::HostArray> ReplicaRows(const runtime::HostArray& array, Replica replica,
                                               const v1::DataSource& data) {
  std::vector<std::string> rows(array.shape.dims.size(), "");
  absl::StatusOr<runtime::HostArray> share = absl::InvalidArgumentError("a scalar has no rows");
  if (!rows.empty()) {
    rows[0] = "hosts";
    share = runtime::ShardOf(array, rows, {"hosts"}, {replica.count}, replica.index);
  }
  if (!share.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("data.example_bundle ", data.example_bundle(),
                                                   ": its batches do not split over ",
                                                   replica.count, " hosts: ",
                                                   share.status().message()));
  }
  return share;
}

// The step's batches from the job's data source. Token shards and synthetic tokens fill only
// the rows of this host's mesh partitions (worker/batch_sources.h); a host replica takes its
// share of the global batch.
absl::StatusOr<std::unique_ptr<worker::BatchSource>> MakeBatches(const v1::JobManifest& manifest,
                                                                 const v1::Program& step,
                                                                 int first_batch_input,
                                                                 const std::string& host,
                                                                 Replica replica) {
  const v1::DataSource& data = manifest.spec().data();
  const v1::MeshAssignment& mesh = manifest.mesh();
  if (data.has_example_bundle()) {
    ASSIGN_OR_RETURN(runtime::ExampleJob bundle, runtime::LoadExampleJob(data.example_bundle()));
    if (bundle.batches.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.example_bundle ", data.example_bundle(), " has no batches"));
    }
    // The bundle's batches are global: replica h takes block h of their rows.
    for (auto& batch : bundle.batches) {
      for (runtime::HostArray& array : batch) {
        if (replica.count > 1) {
          ASSIGN_OR_RETURN(array, ReplicaRows(array, replica, data));
        }
      }
    }
    return worker::MakeCycledBatches(std::move(bundle.batches));
  }
  std::vector<int64_t> partitions;
  for (int p = 0; p < mesh.device_ids_size(); ++p) {
    if (mesh.device_hosts_size() == 0 || mesh.device_hosts(p) == host) partitions.push_back(p);
  }
  worker::TokenBatchSpec batch{.seed = static_cast<uint64_t>(data.seed())};
  std::set<int64_t> rows;
  // A sparse job's last inputs are the plan tables, appended by WithPlanTables.
  const int batch_end =
      step.inputs_size() -
      (manifest.spec().has_sparse_attention()
           ? static_cast<int>(coordinator::SparseTableInputs(manifest.spec().sparse_attention()).size())
           : 0);
  for (int i = first_batch_input; i < batch_end; ++i) {
    const v1::TensorSpec& input = step.inputs(i);
    if (input.shape_size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("batch input ", input.name(), " is not [B, L]"));
    }
    batch.inputs.push_back(input.name());
    batch.batch = input.shape(0);
    (input.name() == worker::kTokensInput ? batch.length : batch.doc_ids_length) = input.shape(1);
    ASSIGN_OR_RETURN(std::vector<int64_t> held,
                     worker::RowsHeld(input.shape(0),
                                      input.sharding_size() > 0 ? input.sharding(0) : "",
                                      {mesh.axis_names().begin(), mesh.axis_names().end()},
                                      {mesh.shape().begin(), mesh.shape().end()}, partitions));
    rows.insert(held.begin(), held.end());
  }
  batch.rows.assign(rows.begin(), rows.end());
  batch.first_row = replica.index * batch.batch;
  if (data.synthetic()) return worker::MakeSyntheticBatches(std::move(batch));
  ASSIGN_OR_RETURN(std::shared_ptr<const worker::TokenCorpus> corpus,
                   worker::TokenCorpus::Open(data.token_shards_glob()));
  if (corpus->receipt().sha256 != manifest.data_receipt().sha256()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "data.token_shards_glob ", data.token_shards_glob(), " reads sha256 ",
        corpus->receipt().sha256, " here, the job's data receipt says ",
        manifest.data_receipt().sha256(), ": the files differ between hosts or changed"));
  }
  return worker::MakeTokenShardBatches(std::move(corpus), std::move(batch));
}

// A sparse-attention job's batches: `inner` yields the step's batch inputs before the plan
// tables (the job's last inputs, validated at submit); the tables are built per batch from its
// doc ids with the contract's cached PlanBuilder.
absl::StatusOr<std::unique_ptr<worker::BatchSource>> WithPlanTables(
    std::unique_ptr<worker::BatchSource> inner, const v1::JobSpec& spec,
    const v1::Program& step, worker::sparse::PlanCache& plans, worker::Metrics& metrics) {
  const v1::SparseAttention& sparse = spec.sparse_attention();
  ASSIGN_OR_RETURN(std::shared_ptr<const worker::sparse::PlanBuilder> builder,
                   plans.GetOrCreate(coordinator::SparseContractOf(sparse)));
  const auto named = coordinator::SparseTableInputs(sparse);
  worker::sparse::PlanBatches::Config config{.inner = std::move(inner),
                                             .builder = std::move(builder),
                                             .doc_ids_index = -1,
                                             .metrics = &metrics};
  const int first_table = step.inputs_size() - static_cast<int>(named.size());
  for (int i = spec.state_count(); i < step.inputs_size(); ++i) {
    const std::string& name = step.inputs(i).name();
    if (name == sparse.doc_ids_input()) config.doc_ids_index = i - spec.state_count();
    for (const auto& [table, input] : named) {
      if (i >= first_table && input == name) config.tables.push_back(table);
    }
  }
  return worker::sparse::PlanBatches::Create(std::move(config));
}

}  // namespace

absl::Status WorkerServer::StartJob(const v1::StartJobRequest& request) {
  const v1::JobManifest& manifest = request.manifest();
  const v1::JobSpec& spec = manifest.spec();
  if (request.job_id().empty() || request.job_id() != manifest.job_id()) {
    return absl::InvalidArgumentError("job_id must be set and match manifest.job_id");
  }
  if (runtime_ == nullptr) {
    return absl::FailedPreconditionError(
        "this worker has no runtime; start meshrun-worker with --pjrt_plugin");
  }
  const int attempt = manifest.attempts_size();
  std::unique_ptr<RunningJob> earlier_run;
  {
    absl::MutexLock lock(&job_mu_);
    if (job_ != nullptr && !job_->loop->result().has_value()) {
      if (job_->job_id != request.job_id()) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_->job_id, " is still running here"));
      }
      if (job_->attempt == attempt) {
        return absl::AlreadyExistsError(absl::StrCat("job ", request.job_id(), " runs here"));
      }
      earlier_run = std::move(job_);  // the job restarted (docs/checkpoints.md)
    }
  }
  if (earlier_run != nullptr) earlier_run->loop->Stop();
  // Compile mode B (MoE, host replicas): grad micro-steps then apply, not one step program.
  const bool mode_b = coordinator::IsModeB(spec);
  ASSIGN_OR_RETURN(auto init, LoadProgram(*runtime_, *executables_, metrics_, manifest, "init"));
  std::shared_ptr<const runtime::Executable> step, grad, apply;
  if (mode_b) {
    ASSIGN_OR_RETURN(grad, LoadProgram(*runtime_, *executables_, metrics_, manifest, "grad"));
    ASSIGN_OR_RETURN(apply, LoadProgram(*runtime_, *executables_, metrics_, manifest, "apply"));
  } else {
    ASSIGN_OR_RETURN(step, LoadProgram(*runtime_, *executables_, metrics_, manifest, "step"));
  }
  // The program that takes the batches, and the one whose outputs carry the telemetry.
  const v1::Program& batch_program = *FindProgram(spec, mode_b ? "grad" : "step");
  const v1::Program& last_program = *FindProgram(spec, mode_b ? "apply" : "step");
  const int num_grad_acc = mode_b ? last_program.inputs_size() - spec.state_count() : 0;
  ASSIGN_OR_RETURN(const Replica replica, ReplicaOf(manifest.mesh(), config_.identity.host));
  ASSIGN_OR_RETURN(std::unique_ptr<worker::BatchSource> batches,
                   MakeBatches(manifest, batch_program, spec.state_count() + num_grad_acc,
                               config_.identity.host, replica));
  worker::RunSpec run{.job_id = manifest.job_id(),
                      .host = config_.identity.host,
                      .num_state = spec.state_count(),
                      .grad_accumulation = mode_b ? spec.grad_accumulation() : 0,
                      .num_grad_acc = num_grad_acc,
                      .seed = static_cast<uint64_t>(spec.data().seed()),
                      .mesh_axes = {manifest.mesh().axis_names().begin(),
                                    manifest.mesh().axis_names().end()},
                      .mesh_shape = {manifest.mesh().shape().begin(), manifest.mesh().shape().end()},
                      .device_ids = {manifest.mesh().device_ids().begin(),
                                     manifest.mesh().device_ids().end()},
                      .telemetry_cadence = spec.telemetry_cadence(),
                      .steps = spec.steps(),
                      .replica_count = manifest.mesh().shape_size() > 0 ? manifest.mesh().shape(0) : 1,
                      .synthetic_data = spec.data().synthetic()};
  for (int i = spec.state_count() + num_grad_acc; i < batch_program.inputs_size(); ++i) {
    const auto& sharding = batch_program.inputs(i).sharding();
    run.batch_sharding.emplace_back(sharding.begin(), sharding.end());
  }
  for (const v1::TelemetryDeclaration& declared : spec.telemetry()) {
    worker::TelemetryOutput output{.name = declared.name()};
    ASSIGN_OR_RETURN(output.combine,
                     telemetry::ParseCombine(absl::AsciiStrToLower(
                         v1::Combine_Name(declared.combine()).substr(strlen("COMBINE_")))));
    if (declared.has_threshold()) output.threshold = declared.threshold();
    for (const v1::TensorSpec& out : last_program.outputs()) {
      if (out.name() == declared.name()) output.sharding = {out.sharding().begin(), out.sharding().end()};
    }
    run.telemetry.push_back(std::move(output));
  }
  if (spec.has_sparse_attention()) {
    ASSIGN_OR_RETURN(batches,
                     WithPlanTables(std::move(batches), spec, batch_program, plans_, metrics_));
  }
  // Host replicas average their accumulators between grad and apply.
  worker::StepLoop::GradientHook reduce_gradients;
  if (replica.count > 1) {
    // Gloo listens on the address the coordinator reaches this worker at.
    ASSIGN_OR_RETURN(const HostPort advertised,
                     ParseHostPort("advertise_address", advertise_address_));
    bool replicated = true;  // data-parallel accumulators: the same on every local device
    for (int i = spec.state_count(); i < last_program.inputs_size(); ++i) {
      for (const std::string& axis : last_program.inputs(i).sharding()) {
        replicated = replicated && axis.empty();
      }
    }
    reduce_gradients = worker::collectives::AverageAcrossHosts(
        {.runtime = runtime_.get(),
         .allreduce = {.rank = replica.index,
                       .size = replica.count,
                       .store = kv_client_,
                       .prefix = absl::StrCat("collectives/", manifest.job_id()),
                       .bind_address = advertised.host,
                       // Twice the job's hang timeout: the coordinator's diagnosis (which
                       // names the host that stopped) comes first, this is the backstop.
                       .timeout = request.hang_timeout_millis() > 0
                                      ? absl::Milliseconds(2 * request.hang_timeout_millis())
                                      : absl::Seconds(60),
                       .peer_names = {manifest.mesh().replica_hosts().begin(),
                                      manifest.mesh().replica_hosts().end()}},
         .replicated_across_devices = replicated,
         .metrics = &metrics_});
    // The heartbeat reports this phase, so a hang names where this host waits.
    reduce_gradients = [this, reduce = std::move(reduce_gradients)](auto& grad_acc) {
      in_allreduce_ = true;
      // Only gloo's part waits for peers (the device transfers wait for this host's compute).
      const double before = metrics_.Get(worker::kAllReduceTime).total;
      absl::Status status = reduce(grad_acc);
      allreduce_seconds_ = metrics_.Get(worker::kAllReduceTime).total - before;
      in_allreduce_ = false;
      return status;
    };
  }
  const std::string job_id = manifest.job_id();
  worker::StepLoop::Config loop_config{
      .runtime = runtime_.get(),
      .init = std::move(init),
      .step = std::move(step),
      .grad = std::move(grad),
      .apply = std::move(apply),
      .reduce_gradients = std::move(reduce_gradients),
      .spec = std::move(run),
      .batches = std::move(batches),
      .sink = [this, incarnation = incarnation(),
               replicated = replica.count > 1](worker::HostStepSummary summary) {
        v1::HostSummary proto = ToProto(summary);
        proto.set_incarnation(incarnation);  // refused once this incarnation is fenced
        if (replicated) {  // replicas in lockstep: what differs is the time not waiting
          proto.set_compute_seconds(
              std::max(1e-9, proto.step_time_seconds() - allreduce_seconds_.load()));
        }
        uploader_->Enqueue(std::move(proto));
      },
      .metrics = &metrics_};
  ASSIGN_OR_RETURN(std::shared_ptr<worker::CheckpointSaver> saver,
                   ConfigureCheckpoints({.manifest = &manifest,
                                         .state_program = &last_program,
                                         .host = config_.identity.host,
                                         .incarnation = incarnation(),
                                         .writes = replica.index == 0,
                                         .runtime = runtime_.get(),
                                         .metrics = &metrics_,
                                         .coordinator = coordinator_.get()},
                                        loop_config));
  // A job's checkpoints are committed before its outcome is reported.
  loop_config.on_done = [this, job_id, attempt, saver](const worker::LoopResult& result) {
    reporters_.Run([this, job_id, attempt, result, saver] {
      if (saver != nullptr) saver->Flush();
      ReportOutcome(job_id, attempt, result);
    });
  };
  ASSIGN_OR_RETURN(std::unique_ptr<worker::StepLoop> loop,
                   worker::StepLoop::Create(std::move(loop_config)));
  RETURN_IF_ERROR(loop->Start());
  spdlog::info("job {} started: {} steps{}, telemetry every {}", job_id, spec.steps(),
               mode_b ? absl::StrCat(" (mode B, ", spec.grad_accumulation(), " micro-steps each)")
                      : std::string(),
               spec.telemetry_cadence());
  std::unique_ptr<RunningJob> finished;
  {
    absl::MutexLock lock(&job_mu_);
    finished = std::move(job_);
    job_ = std::make_unique<RunningJob>(
        RunningJob{job_id, attempt, std::move(saver), std::move(loop)});
  }
  // Joined outside the lock: its on_done callback takes job_mu_.
  if (finished != nullptr) finished->loop->Stop();
  return absl::OkStatus();
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
  job_->loop->RequestCheckpoint();
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
      break;
  }
  spdlog::info("job {} ended {} after step {}{}", job_id, worker::LoopOutcomeName(result.outcome),
               result.last_completed_step,
               result.error.ok() ? "" : ": " + std::string(result.error.message()));
  // The job's last summaries go before its outcome: the coordinator stops collecting then.
  if (!uploader_->Flush(job_id, absl::Seconds(10))) {
    spdlog::warn("job {}: telemetry not all acknowledged before reporting the outcome", job_id);
  }
  // The outcome must not be lost to an outage: a restarted coordinator still knows the job and
  // waits for it, so retry while the coordinator is unreachable, until this worker drains.
  absl::Duration backoff = absl::Seconds(1);
  for (int attempt = 0; !stop_loop_.HasBeenNotified(); ++attempt) {
    v1::ReportJobProgressResponse response;
    auto context = ContextWithTimeout(config_.rpc_timeout);
    grpc::Status status = coordinator_->ReportJobProgress(context.get(), request, &response);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE &&
        status.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED) {
      if (!status.ok()) spdlog::warn("job {}: report refused: {}", job_id, status.error_message());
      return;
    }
    if (attempt % 10 == 0) {
      spdlog::warn("job {}: cannot report the outcome yet ({}); retrying", job_id,
                   status.error_message());
    }
    stop_loop_.WaitForNotificationWithTimeout(backoff);
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
    if (job_ != nullptr) {
      report->set_running_job_id(job_->job_id);
      report->set_current_step(job_->loop->last_completed_step());
    }
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
