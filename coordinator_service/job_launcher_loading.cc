// JobLauncher's ASSIGNED -> LOADING step: each program compiled once per cache key (here or
// on the job's first worker), then streamed to every host that does not hold it.
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "coordinator_service/executable_transfer.h"
#include "coordinator_service/job_launcher.h"
#include "rpc/proto_convert.h"
#include "rpc/server_support.h"
#include "runtime/compile_options.h"
#include "runtime/compile_target.h"

namespace meshrun::services {
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

absl::StatusOr<JobLauncher::CompiledPrograms> JobLauncher::CompilePrograms(
    const std::string& job_id, int attempts, const v1::JobSpec& spec,
    const Assignment& assigned) {
  const coordinator::MeshPlan& plan = assigned.plan;
  const bool compile_here = config_.runtime != nullptr && config_.runtime->identity() == plan.runtime;
  const WorkerInfo& compiler = assigned.hosts.front();
  // A TPU job this coordinator cannot run itself: compiled here for its slice when it can be.
  std::shared_ptr<runtime::TargetCompiler> for_target;
  if (!compile_here && config_.target_compilers != nullptr && plan.runtime.platform_name == "tpu") {
    absl::StatusOr<std::shared_ptr<runtime::TargetCompiler>> target =
        config_.target_compilers->ForHosts(assigned.hosts, plan.num_slices);
    if (target.ok()) {
      for_target = *target;
    } else {
      spdlog::info("job {}: compiling on worker {}: {}", job_id, compiler.host,
                   std::string(target.status().message()));
    }
  }
  const std::string target_name = for_target != nullptr ? for_target->target().name : "";
  std::map<std::string, runtime::ExecutableStats> stats;  // by role, when compiled here
  std::vector<int64_t> device_ids(plan.device_ids.begin(), plan.device_ids.end());
  ASSIGN_OR_RETURN(std::string options,
                   runtime::BuildCompileOptions(runtime::SpmdCompileOptions(device_ids)));
  bool all_hits = true;
  absl::Duration compile_time;
  std::string compiled_on;
  CompiledPrograms compiled;
  std::map<std::string, std::string> fingerprints;  // role -> fingerprint
  for (const v1::Program& stored : spec.programs()) {
    ASSIGN_OR_RETURN(const v1::Program program,
                     config_.programs != nullptr ? config_.programs->Read(job_id, stored)
                                                 : absl::StatusOr<v1::Program>(stored));
    // security: a job's own options reach a compiler only as rebuilt from what a user may set.
    std::string program_options = options;
    if (!program.compile_options().empty()) {
      ASSIGN_OR_RETURN(program_options,
                       runtime::RebuildClientCompileOptions(
                           program.compile_options(),
                           absl::StrCat("program \"", program.role(), "\" compile_options")));
    }
    ASSIGN_OR_RETURN(runtime::ProgramSignature signature, SignatureOf(program));
    const std::string key = coordinator::CacheKey(program.stablehlo(), program_options,
                                                  plan.device_ids, plan.runtime, target_name);
    bool on_worker = false;
    ASSIGN_OR_RETURN(
        auto result,
        config_.cache->GetOrCompile(key, [&]() -> absl::StatusOr<std::string> {
          if (for_target != nullptr) {
            ASSIGN_OR_RETURN(runtime::TargetExecutable executable,
                             for_target->Compile({.code = program.stablehlo(),
                                                  .format = "mlir",
                                                  .compile_options = program_options}));
            if (executable.stats.memory) {
              RETURN_IF_ERROR(runtime::CheckFits(program.role(), *executable.stats.memory,
                                                 for_target->target().chip));
            }
            stats[program.role()] = std::move(executable.stats);
            return std::move(executable.serialized);
          }
          if (!compile_here) {
            on_worker = true;
            return CompileOnWorker(compiler, program, program_options);
          }
          ASSIGN_OR_RETURN(auto executable,
                           config_.runtime->Compile({.code = program.stablehlo(),
                                                     .format = "mlir",
                                                     .compile_options = program_options,
                                                     .signature = signature}));
          if (absl::StatusOr<runtime::ExecutableStats> s = config_.runtime->Stats(*executable);
              s.ok()) {
            stats[program.role()] = *std::move(s);
          }
          return config_.runtime->Serialize(*executable);
        }));
    if (result.outcome != coordinator::ExecutableCache::Outcome::kHit) {
      compiled_on = on_worker            ? compiler.host
                    : for_target != nullptr ? absl::StrCat("coordinator for ", target_name)
                                            : "coordinator";
    }
    if (on_worker) compiled.compiled_by_worker.insert(result.executable.sha256());
    RememberStats(key, program.role(), stats);
    all_hits = all_hits && result.outcome == coordinator::ExecutableCache::Outcome::kHit;
    compile_time += result.compile_time;
    fingerprints[program.role()] = result.executable.sha256();
    compiled.executables.emplace(result.executable.sha256(), result.executable);
    spdlog::info("job {} program {}: {} ({} bytes, compile {})", job_id, program.role(),
                 coordinator::ExecutableCache::OutcomeName(result.outcome),
                 result.executable.size(), absl::FormatDuration(result.compile_time));
  }
  // FLOPs of one training step per device: mode B runs grad grad_accumulation times, then apply.
  double step_flops = 0;
  int64_t device_bytes = 0;
  for (const auto& [role, s] : stats) {
    const int repeats = role == "grad" ? std::max(spec.grad_accumulation(), 1) : 1;
    if (s.flops && role != "init") step_flops += *s.flops * repeats;
    if (s.memory) device_bytes = std::max(device_bytes, s.memory->DeviceBytes());
  }
  RETURN_IF_ERROR(config_.jobs->Update(job_id, [&](v1::JobManifest& m) {
    m.set_compile_target(target_name);
    if (step_flops > 0) m.set_step_flops_per_device(step_flops);
    if (device_bytes > 0) m.set_device_bytes(device_bytes);
    m.set_cache_hit(all_hits);
    m.set_compile_seconds(absl::ToDoubleSeconds(compile_time));
    m.set_compiled_on(compiled_on);
    for (const auto& [role, fp] : fingerprints) (*m.mutable_program_fingerprints())[role] = fp;
  }));
  RETURN_IF_ERROR(config_.jobs->Transition(job_id, v1::JOB_STATE_LOADING, attempts));
  return compiled;
}

absl::Status JobLauncher::DistributeExecutables(const std::string& job_id,
                                                const Assignment& assigned,
                                                const CompiledPrograms& compiled) {
  const std::vector<WorkerInfo>& hosts = assigned.hosts;
  const std::string& compiler = hosts.front().host;
  // Every worker at once, skipping what each already holds.
  std::vector<absl::StatusOr<int64_t>> sent(hosts.size(), int64_t{0});
  RunConcurrently(hosts.size(), [&](size_t i) {
    std::set<std::string> held = HeldBy(*WorkerStub(hosts[i]), hosts[i]);
    if (hosts[i].host == compiler) {
      held.insert(compiled.compiled_by_worker.begin(), compiled.compiled_by_worker.end());
    }
    sent[i] = Distribute(job_id, hosts[i], compiled.executables, held);
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
  return config_.jobs->Update(job_id,
                              [&](v1::JobManifest& m) { m.set_executable_bytes_sent(bytes_sent); });
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
      absl::Status sent = SendExecutable(WorkerStub(host).channel(), executable, options);
      if (absl::IsDataLoss(sent)) {  // corrupted in flight: one retry
        spdlog::warn("job {}: transfer to {} failed ({}); retrying", job_id, host.host,
                     sent.ToString());
        sent = SendExecutable(WorkerStub(host).channel(), executable, options);
      }
      RETURN_IF_ERROR(sent);
      bytes_sent += static_cast<int64_t>(executable.size());
    }
    config_.registry->AddExecutable(host.host, host.incarnation, fingerprint).IgnoreError();
  }
  return bytes_sent;
}

void JobLauncher::RememberStats(const std::string& key, const std::string& role,
                                std::map<std::string, runtime::ExecutableStats>& stats) {
  absl::MutexLock lock(&stats_mu_);
  if (auto made = stats.find(role); made != stats.end()) {
    if (stats_by_key_.size() >= kRememberedStats) stats_by_key_.erase(stats_by_key_.begin());
    stats_by_key_[key] = made->second;
  } else if (auto known = stats_by_key_.find(key); known != stats_by_key_.end()) {
    stats[role] = known->second;
  }
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
  const WorkerChannels::Worker worker = WorkerStub(host);  // its channel outlives the reader
  std::unique_ptr<grpc::ClientReader<v1::LoadExecutableChunk>> reader =
      worker->CompileProgram(context.get(), request);
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

}  // namespace meshrun::services
