// WorkerServer::StartJob: turns a StartJobRequest into a running StepLoop (programs from the
// executable store, the host's replica and batches, collectives, checkpoints). Split from
// worker_server.cc, which keeps the RPC surface and the job's end (registration:
// worker_registration.cc).
#include "worker_service/worker_server.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bundle/example_job.h"
#include "common/status_macros.h"
#include "jobspec/job_validation.h"
#include "jobspec/memory_tier.h"
#include "jobspec/spec_limits.h"
#include "rpc/proto_convert.h"
#include "rpc/server_support.h"
#include "runtime/shard.h"
#include "telemetry/combine.h"
#include "worker/batch_sources.h"
#include "worker/collectives/host_replicas.h"
#include "worker/sparse/plan_batches.h"
#include "worker_service/array_batch_source.h"
#include "worker_service/host_summary_proto.h"
#include "worker_service/worker_checkpoints.h"

namespace meshrun::services {

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
// share of the global batch. An example bundle's files are read only under `roots`.
absl::StatusOr<std::unique_ptr<worker::BatchSource>> MakeBatches(const v1::JobManifest& manifest,
                                                                 const v1::Program& step,
                                                                 int first_batch_input,
                                                                 const std::string& host,
                                                                 Replica replica,
                                                                 const PathRoots& roots) {
  const v1::DataSource& data = manifest.spec().data();
  const v1::MeshAssignment& mesh = manifest.mesh();
  if (data.has_array_file()) return ArrayFileBatchesFor(manifest, replica.index);  // sdk
  if (data.has_example_bundle()) {
    ASSIGN_OR_RETURN(runtime::ExampleJob bundle,
                     runtime::LoadExampleJob(data.example_bundle(), &roots));
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
  const std::vector<int64_t> partitions = jobspec::PartitionsOf(mesh, host);
  worker::TokenBatchSpec batch{.seed = static_cast<uint64_t>(data.seed())};
  std::set<int64_t> rows;
  // A sparse job's last inputs are the plan tables, appended by WithPlanTables.
  const int batch_end =
      step.inputs_size() -
      (manifest.spec().has_sparse_attention()
           ? static_cast<int>(jobspec::SparseTableInputs(manifest.spec().sparse_attention()).size())
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
                   worker::TokenCorpus::Open(data.token_shards_glob(), &roots));
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
                   plans.GetOrCreate(jobspec::SparseContractOf(sparse)));
  const auto named = jobspec::SparseTableInputs(sparse);
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

// The job's programs from the local executable store: init, then step (mode A) or grad and
// apply (mode B).
struct JobPrograms {
  std::shared_ptr<const runtime::Executable> init, step, grad, apply;
};
absl::StatusOr<JobPrograms> LoadPrograms(runtime::Runtime& runtime,
                                         worker::ExecutableStore& executables,
                                         worker::Metrics& metrics, const v1::JobManifest& manifest,
                                         bool mode_b) {
  JobPrograms programs;
  ASSIGN_OR_RETURN(programs.init, LoadProgram(runtime, executables, metrics, manifest, "init"));
  if (mode_b) {
    ASSIGN_OR_RETURN(programs.grad, LoadProgram(runtime, executables, metrics, manifest, "grad"));
    ASSIGN_OR_RETURN(programs.apply, LoadProgram(runtime, executables, metrics, manifest, "apply"));
  } else {
    ASSIGN_OR_RETURN(programs.step, LoadProgram(runtime, executables, metrics, manifest, "step"));
  }
  return programs;
}

// What the step loop runs for `host`: state and accumulator counts, mesh, batch shardings of
// `batch_program` (the one that takes the batches) and the telemetry read from the outputs of
// `last_program` (the one whose outputs carry it). Errors: INVALID_ARGUMENT (a combine the
// telemetry library does not know).
worker::NonFinitePolicy NonFinitePolicyOf(v1::NonFinitePolicy policy) {
  switch (policy) {
    case v1::NONFINITE_WARN: return worker::NonFinitePolicy::kWarn;
    case v1::NONFINITE_IGNORE: return worker::NonFinitePolicy::kIgnore;
    default: return worker::NonFinitePolicy::kFail;  // unset is fail
  }
}

absl::StatusOr<worker::RunSpec> RunSpecOf(const v1::JobManifest& manifest, const std::string& host,
                                          const v1::Program& batch_program,
                                          const v1::Program& last_program, int num_grad_acc,
                                          bool mode_b) {
  const v1::JobSpec& spec = manifest.spec();
  const v1::MeshAssignment& mesh = manifest.mesh();
  worker::RunSpec run{.job_id = manifest.job_id(),
                      .host = host,
                      .num_state = spec.state_count(),
                      .grad_accumulation = mode_b ? spec.grad_accumulation() : 0,
                      .num_grad_acc = num_grad_acc,
                      .seed = static_cast<uint64_t>(spec.data().seed()),
                      .mesh_axes = {mesh.axis_names().begin(), mesh.axis_names().end()},
                      .mesh_shape = {mesh.shape().begin(), mesh.shape().end()},
                      .device_ids = {mesh.device_ids().begin(), mesh.device_ids().end()},
                      .device_partitions = {mesh.partitions().begin(), mesh.partitions().end()},
                      .telemetry_cadence = spec.telemetry_cadence(),
                      .steps = spec.steps(),
                      .replica_count = mesh.shape_size() > 0 ? mesh.shape(0) : 1,
                      .synthetic_data = spec.data().synthetic(),
                      .on_nonfinite = NonFinitePolicyOf(spec.on_nonfinite())};
  for (int i = spec.state_count() + num_grad_acc; i < batch_program.inputs_size(); ++i) {
    const auto& sharding = batch_program.inputs(i).sharding();
    run.batch_sharding.emplace_back(sharding.begin(), sharding.end());
  }
  for (const v1::TelemetryDeclaration& declared : spec.telemetry()) {
    worker::TelemetryOutput output{.name = declared.name(), .output = declared.output()};
    ASSIGN_OR_RETURN(output.combine,
                     telemetry::ParseCombine(absl::AsciiStrToLower(
                         v1::Combine_Name(declared.combine()).substr(strlen("COMBINE_")))));
    if (declared.has_threshold()) output.threshold = declared.threshold();
    for (const v1::TensorSpec& out : last_program.outputs()) {
      if (out.name() == jobspec::TelemetryOutputName(declared)) output.sharding = {out.sharding().begin(), out.sharding().end()};
    }
    run.telemetry.push_back(std::move(output));
  }
  return run;
}

}  // namespace

absl::Status WorkerServer::CheckStartable(const v1::StartJobRequest& request) {
  const v1::JobManifest& manifest = request.manifest();
  if (request.job_id().empty() || request.job_id() != manifest.job_id()) {
    return absl::InvalidArgumentError("job_id must be set and match manifest.job_id");
  }
  if (runtime_ == nullptr) {
    return absl::FailedPreconditionError(
        "this worker has no runtime; start meshrun-worker with --pjrt_plugin");
  }
  // Fencing: a StartJob that waited for an address while the worker behind it was restarted
  // addresses the dead incarnation; this process is not a member of that job.
  if (auto member = manifest.host_incarnations().find(config_.identity.host);
      member != manifest.host_incarnations().end() && member->second != incarnation()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", request.job_id(), " was assigned to incarnation ", member->second, " of host ",
        config_.identity.host, "; this process is incarnation ", incarnation(),
        " (the worker restarted or re-registered)"));
  }
  // limits: the data, bundle and checkpoint paths a client chose, only under --data_root.
  return jobspec::CheckWorkerSpecPaths(manifest.spec(), data_roots_);
}

absl::Status WorkerServer::StopEarlierRun(const std::string& job_id, int attempt) {
  std::unique_ptr<RunningJob> earlier_run;
  {
    absl::MutexLock lock(&job_mu_);
    if (job_ != nullptr && !job_->loop->result().has_value()) {
      if (job_->job_id != job_id) {
        return absl::FailedPreconditionError(
            absl::StrCat("job ", job_->job_id, " is still running here"));
      }
      if (job_->attempt == attempt) {
        return absl::AlreadyExistsError(absl::StrCat("job ", job_id, " runs here"));
      }
      earlier_run = std::move(job_);  // the job restarted (docs/checkpoints.md)
    }
  }
  if (earlier_run != nullptr) earlier_run->loop->Stop();
  uploader_->DropEarlierRuns(job_id, attempt);
  return absl::OkStatus();
}

absl::StatusOr<worker::StepLoop::GradientHook> WorkerServer::GradientAverager(
    const v1::StartJobRequest& request, int replica_index, int replica_count,
    const v1::Program& apply_program) {
  const v1::JobManifest& manifest = request.manifest();
  // Gloo listens on the address the coordinator reaches this worker at.
  ASSIGN_OR_RETURN(const HostPort advertised,
                   ParseHostPort("advertise_address", advertise_address_));
  bool replicated = true;  // data-parallel accumulators: the same on every local device
  for (int i = manifest.spec().state_count(); i < apply_program.inputs_size(); ++i) {
    for (const std::string& axis : apply_program.inputs(i).sharding()) {
      replicated = replicated && axis.empty();
    }
  }
  worker::StepLoop::GradientHook reduce = worker::collectives::AverageAcrossHosts(
      {.runtime = runtime_.get(),
       .allreduce = {.rank = replica_index,
                     .size = replica_count,
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
  return [this, reduce = std::move(reduce)](auto& grad_acc) {
    in_allreduce_ = true;
    // Only gloo's part waits for peers (the device transfers wait for this host's compute).
    const double before = metrics_.Get(worker::kAllReduceTime).total;
    absl::Status status = reduce(grad_acc);
    allreduce_seconds_ = metrics_.Get(worker::kAllReduceTime).total - before;
    in_allreduce_ = false;
    return status;
  };
}

std::function<void(worker::HostStepSummary)> WorkerServer::SummarySink(int attempt,
                                                                       bool replicated) {
  return [this, incarnation = incarnation(), attempt, replicated](worker::HostStepSummary summary) {
    v1::HostSummary proto = ToProto(summary);
    proto.set_incarnation(incarnation);  // refused once this incarnation is fenced
    proto.set_attempt(attempt);          // dropped once the job restarted
    if (replicated) {  // replicas in lockstep: what differs is the time not waiting
      proto.set_compute_seconds(
          std::max(1e-9, proto.step_time_seconds() - allreduce_seconds_.load()));
    }
    uploader_->Enqueue(std::move(proto));
  };
}

void WorkerServer::InstallRunningJob(std::unique_ptr<RunningJob> job) {
  std::unique_ptr<RunningJob> finished;
  {
    absl::MutexLock lock(&job_mu_);
    finished = std::move(job_);
    job_ = std::move(job);
  }
  // Joined outside the lock: its on_done callback takes job_mu_.
  if (finished != nullptr) finished->loop->Stop();
}

absl::Status WorkerServer::StartJob(const v1::StartJobRequest& request) {
  RETURN_IF_ERROR(CheckStartable(request));
  const v1::JobManifest& manifest = request.manifest();
  const v1::JobSpec& spec = manifest.spec();
  const std::string job_id = manifest.job_id();
  const int attempt = manifest.attempts_size();
  RETURN_IF_ERROR(StopEarlierRun(job_id, attempt));
  // This run's summaries go through the relay the coordinator named (none: to it directly).
  uploader_->UseRelay(request.telemetry_relay_host(), request.telemetry_relay_address());
  // Compile mode B (MoE, host replicas): grad micro-steps then apply, not one step program.
  const bool mode_b = jobspec::IsModeB(spec);
  ASSIGN_OR_RETURN(JobPrograms programs,
                   LoadPrograms(*runtime_, *executables_, metrics_, manifest, mode_b));
  // The program that takes the batches, and the one whose outputs carry the telemetry.
  const v1::Program& batch_program = *FindProgram(spec, mode_b ? "grad" : "step");
  const v1::Program& last_program = *FindProgram(spec, mode_b ? "apply" : "step");
  const int num_grad_acc = mode_b ? last_program.inputs_size() - spec.state_count() : 0;
  ASSIGN_OR_RETURN(const Replica replica, ReplicaOf(manifest.mesh(), config_.identity.host));
  ASSIGN_OR_RETURN(std::unique_ptr<worker::BatchSource> batches,
                   MakeBatches(manifest, batch_program, spec.state_count() + num_grad_acc,
                               config_.identity.host, replica, data_roots_));
  ASSIGN_OR_RETURN(worker::RunSpec run, RunSpecOf(manifest, config_.identity.host, batch_program,
                                                  last_program, num_grad_acc, mode_b));
  if (spec.has_sparse_attention()) {
    ASSIGN_OR_RETURN(batches,
                     WithPlanTables(std::move(batches), spec, batch_program, plans_, metrics_));
  }
  // Host replicas average their accumulators between grad and apply.
  worker::StepLoop::GradientHook reduce_gradients;
  if (replica.count > 1) {
    ASSIGN_OR_RETURN(reduce_gradients,
                     GradientAverager(request, replica.index, replica.count, last_program));
  }
  worker::StepLoop::Config loop_config{.runtime = runtime_.get(),
                                       .init = std::move(programs.init),
                                       .step = std::move(programs.step),
                                       .grad = std::move(programs.grad),
                                       .apply = std::move(programs.apply),
                                       .reduce_gradients = std::move(reduce_gradients),
                                       .spec = std::move(run),
                                       .batches = std::move(batches),
                                       .sink = SummarySink(attempt, replica.count > 1),
                                       .metrics = &metrics_};
  ASSIGN_OR_RETURN(std::shared_ptr<worker::CheckpointSaver> saver,
                   ConfigureCheckpoints({.manifest = &manifest,
                                         .state_program = &last_program,
                                         .host = config_.identity.host,
                                         .incarnation = incarnation(),
                                         .writes = replica.index == 0,
                                         .runtime = runtime_.get(),
                                         .metrics = &metrics_,
                                         .coordinator = coordinator_.get(),
                                         .memory = &memory_checkpoints_,
                                         .ring_peer_address = request.ring_peer_address()},
                                        loop_config));
  // A job's checkpoints are committed before its outcome is reported.
  loop_config.on_done = [this, job_id, attempt, saver](const worker::LoopResult& result) {
    // A job that ended here needs no restart's copy of its state (a failed one may).
    if (result.outcome == worker::LoopOutcome::kSucceeded) memory_checkpoints_.Drop(job_id);
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
  InstallRunningJob(std::make_unique<RunningJob>(
      RunningJob{job_id, attempt, std::move(saver), std::move(loop)}));
  return absl::OkStatus();
}

}  // namespace meshrun::services
