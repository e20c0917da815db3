// meshrun: the command-line client.
#include <google/protobuf/text_format.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "bundle/job_bundle.h"
#include "common/grpc_status.h"
#include "common/protocol.h"
#include "jobspec/job_states.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "rpc/binary_setup.h"
#include "cli/cli_certs.h"
#include "cli/cli_checkpoints.h"
#include "cli/cli_compile.h"
#include "cli/cli_common.h"
#include "cli/cli_get.h"
#include "cli/cli_help.h"
#include "cli/cli_telemetry.h"
#include "cli/cli_upload.h"
#include "cli/cli_workers.h"
#include "rpc/grpc_probe.h"
#include "rpc/proto_convert.h"
#include "rpc/server_support.h"
#include "runtime/identity.h"

ABSL_FLAG(absl::Duration, wait, absl::Seconds(30),
          "workers --expect / submit --follow: how long to wait");
ABSL_FLAG(int64_t, steps, 100, "submit: training steps");
ABSL_FLAG(int64_t, cadence, 10, "submit: a telemetry summary every N steps");
ABSL_FLAG(std::string, data, "",
          "submit: token shard glob to train on (e.g. '.data/fortunes/*.tok'), an array-batch "
          "file (meshrun.data.write_arrays: any model's batch inputs, docs/data.md), or "
          "'synthetic' for seeded random tokens; empty: the bundle's own batches");
ABSL_FLAG(int, host_replicas, 0,
          "submit: run the mesh on this many CPU hosts, data-parallel across them (mode B "
          "jobs; 0: the bundle's mesh.host_replicas)");
ABSL_FLAG(bool, follow, false,
          "submit: wait until the job ends and print its summary (--output=json: its manifest)");
ABSL_FLAG(std::string, on_nonfinite, "fail",
          "submit: what a logging step whose loss, grad norm or other scalar series is NaN or "
          "infinite does: fail (stop the job FAILED, naming the step and series; its "
          "checkpoints are kept), warn (go on, marked in the manifest) or ignore");

namespace meshrun::services {
namespace {

int Health(const std::vector<std::string>& args) {
  if (args.size() > 3) ExitWithError("usage: meshrun health [HOST:PORT]", 2);
  // Without an address: the coordinator's (--coordinator, $MESHRUN_COORDINATOR).
  const std::string address = args.size() == 3 ? args[2] : absl::GetFlag(FLAGS_coordinator);
  if (auto parsed = ParseHostPort("address", address); !parsed.ok()) {
    ExitWithError(absl::StrCat("address \"", address,
                               "\" is not HOST:PORT, e.g. 127.0.0.1:7070"), 2);
  }
  const bool json = JsonOutput();
  absl::StatusOr<std::string> health =
      CheckHealth(MakeChannel(address), "", absl::GetFlag(FLAGS_timeout));
  if (!health.ok()) {
    const std::string code = absl::StatusCodeToString(health.status().code());
    const std::string message(health.status().message());
    if (json) {
      PrintJsonObject({{"address", address}, {"status", "NOT_SERVING"}, {"code", code},
                       {"message", message}});
    } else {
      std::printf("NOT SERVING: %s: %s\n", code.c_str(), message.c_str());
    }
    return 1;
  }
  if (json) {
    PrintJsonObject({{"address", address}, {"status", *health}});
  } else {
    std::printf("%s\n", health->c_str());
  }
  return *health == "SERVING" ? 0 : 1;
}

// The manifest without the programs' tensor lists, which would drown everything else.
std::string ManifestText(v1::JobManifest job) {
  for (v1::Program& program : *job.mutable_spec()->mutable_programs()) {
    program.clear_inputs();
    program.clear_outputs();
    program.clear_donated_inputs();
  }
  std::string text;
  google::protobuf::TextFormat::PrintToString(job, &text);
  return text;
}

v1::NonFinitePolicy NonFinitePolicyFlag() {
  const std::string value = absl::GetFlag(FLAGS_on_nonfinite);
  if (value == "fail") return v1::NONFINITE_FAIL;
  if (value == "warn") return v1::NONFINITE_WARN;
  if (value == "ignore") return v1::NONFINITE_IGNORE;
  ExitWithError(absl::StrCat("--on_nonfinite=", value, " is not fail, warn or ignore"), 2);
}

int Submit(const std::vector<std::string>& args) {
  if (args.size() != 3) ExitWithError("usage: meshrun submit <bundle directory or job.json>", 2);
  absl::StatusOr<v1::JobSpec> spec = client::JobSpecFromBundle(
      args[2], {.steps = absl::GetFlag(FLAGS_steps),
                .telemetry_cadence = absl::GetFlag(FLAGS_cadence),
                .data = absl::GetFlag(FLAGS_data),
                .host_replicas = absl::GetFlag(FLAGS_host_replicas)});
  if (!spec.ok()) ExitWithError(std::string(spec.status().message()), 2);
  spec->set_on_nonfinite(NonFinitePolicyFlag());
  auto stub = CoordinatorStub();
  absl::Status flags = ApplyCheckpointFlags(*spec, [&stub](const std::string& job_id) {
    v1::GetJobRequest get;
    get.set_job_id(job_id);
    v1::JobManifest job;
    auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout));
    return stub->GetJob(context.get(), get, &job).ok()
               ? absl::StatusOr<v1::JobManifest>(job)
               : absl::NotFoundError(absl::StrCat("--resume_from ", job_id,
                                                  " is neither a directory nor a job id"));
  });
  if (!flags.ok()) ExitWithError(std::string(flags.message()), 2);
  CheckCall(ToGrpcStatus(UploadPrograms(*stub, *spec, absl::GetFlag(FLAGS_timeout))),
            "submit refused");
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  v1::SubmitJobResponse response;
  auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout));
  CheckCall(stub->SubmitJob(context.get(), request, &response), "submit refused");
  for (const std::string& warning : response.warnings()) {
    std::fprintf(stderr, "meshrun: warning: %s\n", warning.c_str());
  }
  if (!JsonOutput()) std::printf("%s\n", response.job_id().c_str());
  if (JsonOutput() && !absl::GetFlag(FLAGS_follow)) PrintJson(response);
  if (!absl::GetFlag(FLAGS_follow)) return 0;
  const absl::Time give_up = absl::Now() + absl::GetFlag(FLAGS_wait);
  v1::JobManifest job;
  while (true) {
    v1::GetJobRequest get;
    get.set_job_id(response.job_id());
    auto get_context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout));
    CheckCall(stub->GetJob(get_context.get(), get, &job), "get");
    if (jobspec::IsFinal(job.state()) || absl::Now() >= give_up) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  if (JsonOutput()) {
    PrintJson(job);
  } else if (absl::GetFlag(FLAGS_output) == "textproto") {
    std::printf("%s", ManifestText(job).c_str());
  } else {
    std::printf("%s", JobSummaryText(job).c_str());
  }
  if (job.state() == v1::JOB_STATE_SUCCEEDED) return 0;
  return jobspec::IsFinal(job.state()) ? kExitJobFailed : kExitStillRunning;
}

int Get(const std::vector<std::string>& args) {
  if (args.size() != 3) ExitWithError("usage: meshrun get <job-id>", 2);
  auto stub = CoordinatorStub();
  v1::GetJobRequest request;
  request.set_job_id(args[2]);
  v1::JobManifest job;
  auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout));
  CheckCall(stub->GetJob(context.get(), request, &job), "get");
  if (JsonOutput()) {
    PrintJson(job);
  } else if (absl::GetFlag(FLAGS_output) == "textproto") {
    std::printf("%s", ManifestText(job).c_str());
  } else {
    std::printf("%s", JobSummaryText(job).c_str());
  }
  return 0;
}

int List() {
  auto stub = CoordinatorStub();
  v1::ListJobsResponse response;
  auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout));
  CheckCall(stub->ListJobs(context.get(), {}, &response), "list");
  if (JsonOutput()) {
    PrintJson(response);
    return 0;
  }
  std::printf("%-10s %-24s %-10s %-8s %-6s %s\n", "JOB", "NAME", "STATE", "STEP", "CACHE",
              "NOTE");
  for (const v1::JobManifest& job : response.jobs()) {
    std::string state = v1::JobState_Name(job.state()).substr(strlen("JOB_STATE_"));
    std::string note = job.error().empty() ? "" : job.failed_host() + ": " + job.error();
    std::printf("%-10s %-24s %-10s %-8lld %-6s %s\n", job.job_id().c_str(),
                job.spec().name().c_str(), state.c_str(), static_cast<long long>(job.last_step()),
                job.cache_hit() ? "hit" : "miss", note.c_str());
  }
  return 0;
}

int Drain(const std::vector<std::string>& args) {
  if (args.size() != 3) ExitWithError("usage: meshrun drain <host>", 2);
  v1::DrainWorkerRequest request;
  request.set_host(args[2]);
  v1::DrainWorkerResponse response;
  auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout));
  CheckCall(CoordinatorStub()->DrainWorker(context.get(), request, &response), "drain");
  if (JsonOutput()) {
    PrintJsonObject({{"draining", args[2]}});
  } else {
    std::printf("worker %s is draining\n", args[2].c_str());
  }
  return 0;
}

int Cancel(const std::vector<std::string>& args) {
  if (args.size() != 3) ExitWithError("usage: meshrun cancel <job-id>", 2);
  auto stub = CoordinatorStub();
  v1::CancelJobRequest request;
  request.set_job_id(args[2]);
  v1::CancelJobResponse response;
  auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout));
  CheckCall(stub->CancelJob(context.get(), request, &response), "cancel");
  if (JsonOutput()) {
    PrintJsonObject({{"cancelled", args[2]}});
  } else {
    std::printf("cancelled %s\n", args[2].c_str());
  }
  return 0;
}

int Checkpoint(const std::vector<std::string>& args) {
  if (args.size() != 3) ExitWithError("usage: meshrun checkpoint <job-id>", 2);
  auto stub = CoordinatorStub();
  v1::CheckpointJobRequest request;
  request.set_job_id(args[2]);
  v1::CheckpointJobResponse response;
  auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout));
  CheckCall(stub->CheckpointJob(context.get(), request, &response), "checkpoint");
  if (JsonOutput()) {  // the shape of cancel's
    PrintJsonObject({{"checkpoint_requested", args[2]}, {"step", absl::StrCat(response.step())}});
    return 0;
  }
  const std::string step = response.step() == 0 ? "the current step"
                                                 : absl::StrCat("step ", response.step());
  std::printf("checkpoint of %s requested for %s: it is committed once every host wrote its "
              "shards (meshrun get %s lists it)\n", step.c_str(), args[2].c_str(),
              args[2].c_str());
  return 0;
}

int Metrics(const std::vector<std::string>& args) {
  auto stub = CoordinatorStub();
  v1::GetMetricsRequest request;
  if (args.size() > 2) request.set_host(args[2]);
  v1::GetMetricsResponse response;
  auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout) + absl::Seconds(5));
  CheckCall(stub->GetMetrics(context.get(), request, &response), "metrics");
  if (JsonOutput()) {
    PrintJson(response);
    return 0;
  }
  for (const v1::HostMetrics& host : response.hosts()) {
    std::printf("== %s\n", host.host().c_str());
    for (const v1::Metric& m : host.metrics()) {
      if (m.unit() == "seconds") {
        std::printf("Metric: %s\n  TotalSamples: %lld\n  Accumulator: %.6fs\n", m.name().c_str(),
                    static_cast<long long>(m.count()), m.total());
      } else if (m.unit() == "bytes") {
        std::printf("Metric: %s\n  TotalSamples: %lld\n  Accumulator: %.0f bytes\n",
                    m.name().c_str(), static_cast<long long>(m.count()), m.total());
      } else {
        std::printf("Counter: %s\n  Value: %lld\n", m.name().c_str(),
                    static_cast<long long>(m.count()));
      }
    }
  }
  return 0;
}

int Memory(const std::vector<std::string>& args) {
  if (args.size() < 3 || args.size() > 4) ExitWithError("usage: meshrun memory <host> [device]", 2);
  auto stub = CoordinatorStub();
  v1::GetDeviceMemoryRequest request;
  request.set_host(args[2]);
  if (args.size() == 4) request.set_runtime_name(args[3]);
  v1::GetDeviceMemoryResponse response;
  auto context = ContextWithTimeout(absl::GetFlag(FLAGS_timeout) + absl::Seconds(5));
  CheckCall(stub->GetDeviceMemory(context.get(), request, &response), "memory");
  if (JsonOutput()) {
    PrintJson(response);
    return 0;
  }
  auto bytes = [](bool has, int64_t value) {
    return has ? absl::StrCat(value) : std::string("-");
  };
  std::printf("%-10s %14s %14s %14s  %s\n", "DEVICE", "IN_USE", "PEAK", "LIMIT", "NOTE");
  for (const v1::DeviceMemory& d : response.devices()) {
    std::printf("%-10s %14s %14s %14s  %s\n", d.runtime_name().c_str(),
                bytes(d.has_bytes_in_use(), d.bytes_in_use()).c_str(),
                bytes(d.has_peak_bytes_in_use(), d.peak_bytes_in_use()).c_str(),
                bytes(d.has_bytes_limit(), d.bytes_limit()).c_str(),
                d.unreported_reason().c_str());
  }
  return 0;
}

}  // namespace
}  // namespace meshrun::services

int main(int argc, char** argv) {
  using namespace meshrun::services;
  if (const int code = MaybePrintHelp(argc, argv); code >= 0) return code;
  std::vector<std::string> args = InitBinary("meshrun", GlobalUsage(), argc, argv);
  if (args.size() < 2) ExitWithError(std::string("no command given\n") + GlobalUsage(), 2);
  const std::string& command = args[1];
  if (command == "certs") return meshrun::services::RunCertsCommand(args);
  if (command == "compile") return meshrun::services::RunCompileCommand(args);
  if (command == "health") return Health(args);
  if (command == "workers") return Workers(args);
  if (command == "submit") return Submit(args);
  if (command == "get") return Get(args);
  if (command == "list") return List();
  if (command == "cancel") return Cancel(args);
  if (command == "drain") return Drain(args);
  if (command == "checkpoint") return Checkpoint(args);
  if (command == "watch") return Watch(args);
  if (command == "export") return Export(args);
  if (command == "metrics") return Metrics(args);
  if (command == "memory") return Memory(args);
  if (command == "version") {
    if (meshrun::services::JsonOutput()) {
      std::printf("{\"version\":\"%s\",\"protocol_min\":%u,\"protocol_max\":%u}\n",
                  MESHRUN_VERSION, meshrun::kProtocolMinVersion, meshrun::kProtocolMaxVersion);
      return 0;
    }
    std::printf("meshrun %s, protocol %u..%u\n", MESHRUN_VERSION, meshrun::kProtocolMinVersion,
                meshrun::kProtocolMaxVersion);
    return 0;
  }
  ExitWithError("unknown command \"" + command + "\"; commands: " + CommandList(), 2);
}
