#include "testing/scale_run.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "bundle/job_bundle.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "meshrun/v1/coordinator.grpc.pb.h"
#include "testing/fake_fleet.h"
#include "tests/watch_fleet.h"

extern char** environ;

namespace meshrun::test_support {
namespace {

// A coordinator process of its own: started on a free loopback port with its state under
// `dir`, stopped (SIGTERM, then SIGKILL after 10 s) on destruction.
class CoordinatorProcess {
 public:
  static absl::StatusOr<std::unique_ptr<CoordinatorProcess>> Start(
      const ScaleOptions& options, const std::string& dir) {
    auto process = std::unique_ptr<CoordinatorProcess>(new CoordinatorProcess);
    process->log_ = dir + "/coordinator.log";
    std::vector<std::string> args = {options.bin_dir + "/meshrun-coordinator",
                                     "--listen=127.0.0.1:0", "--state_dir=" + dir + "/state"};
    args.insert(args.end(), options.coordinator_flags.begin(), options.coordinator_flags.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 1, process->log_.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&actions, 1, 2);
    const int spawned =
        posix_spawn(&process->pid_, argv[0], &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    if (spawned != 0) {
      return absl::InternalError(absl::StrCat("starting ", argv[0], ": ", strerror(spawned)));
    }
    for (int i = 0; i < 400; ++i) {
      std::ifstream in(process->log_);
      std::stringstream text;
      text << in.rdbuf();
      const std::string log = text.str();
      if (size_t at = log.find("listening on port "); at != std::string::npos) {
        int port = 0;
        std::string digits = log.substr(at + 18, log.find_first_not_of("0123456789", at + 18) -
                                                     (at + 18));
        if (absl::SimpleAtoi(digits, &port)) {
          process->address_ = absl::StrCat("127.0.0.1:", port);
          return process;
        }
      }
      if (waitpid(process->pid_, nullptr, WNOHANG) == process->pid_) {
        process->pid_ = 0;
        return absl::InternalError(absl::StrCat("the coordinator exited at start: ", log));
      }
      absl::SleepFor(absl::Milliseconds(25));
    }
    return absl::DeadlineExceededError(
        absl::StrCat("the coordinator did not listen within 10 s; see ", process->log_));
  }
  ~CoordinatorProcess() {
    if (pid_ <= 0) return;
    kill(pid_, SIGTERM);
    for (int i = 0; i < 1000; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) return;
      absl::SleepFor(absl::Milliseconds(10));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  const std::string& address() const { return address_; }

  // CPU seconds the process has used (user + system), from /proc/<pid>/stat.
  // Nanosecond-exact where the kernel lets us read the process's CPU clock (/proc/<pid>/stat
  // counts 10 ms ticks: 10 us per beat at 1024 hosts), else from /proc.
  double CpuSeconds() const {
    clockid_t clock;
    timespec now;
    if (clock_getcpuclockid(pid_, &clock) == 0 && clock_gettime(clock, &now) == 0) {
      return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
    }
    std::ifstream in(absl::StrCat("/proc/", pid_, "/stat"));
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream fields(text.substr(text.rfind(')') + 2));  // after "(comm) "
    std::string field;
    double ticks = 0;
    for (int i = 3; i <= 15 && fields >> field; ++i) {
      if (i == 14 || i == 15) ticks += std::stod(field);  // utime, stime
    }
    return ticks / static_cast<double>(sysconf(_SC_CLK_TCK));
  }
  // A field of /proc/<pid>/status ("Threads", "VmRSS"), as its number.
  int64_t Status(const std::string& name) const {
    std::ifstream in(absl::StrCat("/proc/", pid_, "/status"));
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(name + ":", 0) == 0) {
        std::istringstream value(line.substr(name.size() + 1));
        int64_t n = 0;
        value >> n;
        return n;
      }
    }
    return 0;
  }

 private:
  CoordinatorProcess() = default;
  pid_t pid_ = 0;
  std::string log_;
  std::string address_;
};

// Each fake host holds a listening socket and a connection to the coordinator, and the
// coordinator one to each host: a thousand hosts need more descriptors than the usual 1024.
void RaiseOpenFileLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    setrlimit(RLIMIT_NOFILE, &limit);
  }
}

grpc::ClientContext* WithDeadline(grpc::ClientContext& context, absl::Duration timeout) {
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return &context;
}

// The call's status, its error prefixed with the call's name.
absl::Status FromGrpc(const grpc::Status& status, const std::string& what) {
  const absl::Status converted = FromGrpcStatus(status);
  if (converted.ok()) return converted;
  return absl::Status(converted.code(), absl::StrCat(what, ": ", converted.message()));
}

// The example job on every device of the fleet: the planner makes the mesh data-parallel over
// all of them (dp auto); the fleet's hosts compile it (the coordinator holds no libtpu).
// Nothing runs it, so only its size and signature matter.
absl::StatusOr<v1::JobSpec> SpanningJob(const ScaleOptions& options) {
  ASSIGN_OR_RETURN(v1::JobSpec spec,
                   client::JobSpecFromBundle(
                       options.source_dir + "/examples/mlp_classifier/dp8",
                       {.steps = options.steps * 1000, .telemetry_cadence = 1}));
  // Its arrays are replicated, so its signature fits a mesh of any size.
  for (v1::Program& program : *spec.mutable_programs()) {
    for (auto* tensors : {program.mutable_inputs(), program.mutable_outputs()}) {
      for (v1::TensorSpec& tensor : *tensors) {
        for (std::string& axis : *tensor.mutable_sharding()) axis.clear();
        *tensor.mutable_shard_shape() = tensor.shape();
      }
    }
  }
  spec.mutable_mesh()->set_data_parallel(0);
  spec.mutable_mesh()->set_tensor_parallel(0);
  spec.mutable_mesh()->set_expert_parallel(0);
  return spec;
}

int64_t EnteredMicros(const v1::JobManifest& job, const std::string& state) {
  auto it = job.state_entered_unix_micros().find(state);
  return it == job.state_entered_unix_micros().end() ? 0 : it->second;
}
}  // namespace

absl::StatusOr<ScaleFigures> RunAtScale(const ScaleOptions& options) {
  RaiseOpenFileLimit();
  const std::string dir = std::filesystem::temp_directory_path() /
                          absl::StrCat("meshrun_scale_", getpid(), "_", options.hosts);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  ScaleFigures figures{.hosts = options.hosts};
  ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorProcess> coordinator,
                   CoordinatorProcess::Start(options, dir));
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(coordinator->address(), grpc::InsecureChannelCredentials()));
  FakeFleet fleet({.coordinator = coordinator->address(),
                   .hosts = options.hosts,
                   .devices_per_host = options.devices_per_host,
                   .executable_bytes = options.executable_bytes,
                   .unary_heartbeats = options.unary_heartbeats});

  // Registration, then heartbeats alone.
  double cpu = coordinator->CpuSeconds();
  RETURN_IF_ERROR(fleet.Start());
  figures.register_cpu_per_host_ms = (coordinator->CpuSeconds() - cpu) * 1e3 / options.hosts;
  figures.rss_mib_registered = coordinator->Status("VmRSS") / 1024.0;
  // A host's first beat opens its stream (a new call); wait out that first round, bounded, so
  // that what follows prices the beats a long-lived fleet sends.
  const absl::Time opened_by = absl::Now() + 2 * fleet.heartbeat_interval() + absl::Seconds(1);
  while (fleet.GetFigures().heartbeats < options.hosts && absl::Now() < opened_by) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  // Idle beats go out as a worker's do, unanswered; the launch and telemetry phases time theirs.
  fleet.TimeHeartbeats(false);
  fleet.ResetHeartbeatFigures();
  // At least one whole interval: every host beats in it, and the CPU clock's 10 ms ticks are
  // small against what the beats cost.
  const absl::Duration idle = std::max(options.idle, fleet.heartbeat_interval());
  cpu = coordinator->CpuSeconds();
  absl::SleepFor(idle);
  const double idle_cpu = coordinator->CpuSeconds() - cpu;
  const double idle_rate = idle_cpu / absl::ToDoubleSeconds(idle);
  const int64_t beats = std::max<int64_t>(1, fleet.GetFigures().heartbeats);
  figures.heartbeat_cpu_per_beat_us = idle_cpu * 1e6 / static_cast<double>(beats);
  figures.heartbeat_core_share = idle_rate;

  // The launch: submit, then read the job until it runs or fails.
  fleet.TimeHeartbeats(true);
  fleet.ResetHeartbeatFigures();
  ASSIGN_OR_RETURN(v1::JobSpec spec, SpanningJob(options));
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = spec;
  v1::SubmitJobResponse submitted;
  grpc::ClientContext submit_context;
  const absl::Time submit_time = absl::Now();
  RETURN_IF_ERROR(FromGrpc(stub->SubmitJob(WithDeadline(submit_context, absl::Seconds(30)),
                                           submit, &submitted),
                           "SubmitJob"));
  const std::string job_id = submitted.job_id();
  v1::JobManifest job;
  for (const absl::Time deadline = absl::Now() + options.launch_timeout; absl::Now() < deadline;
       absl::SleepFor(absl::Milliseconds(20))) {
    figures.peak_threads =
        std::max(figures.peak_threads, static_cast<int>(coordinator->Status("Threads")));
    grpc::ClientContext context;
    v1::GetJobRequest request;
    request.set_job_id(job_id);
    if (!stub->GetJob(WithDeadline(context, absl::Seconds(5)), request, &job).ok()) continue;
    if (job.state() == v1::JOB_STATE_RUNNING || job.state() == v1::JOB_STATE_FAILED ||
        job.state() == v1::JOB_STATE_CANCELLED) {
      break;
    }
  }
  figures.submit_to_running_s = absl::ToDoubleSeconds(absl::Now() - submit_time);
  figures.job_state = v1::JobState_Name(job.state()).substr(strlen("JOB_STATE_"));
  figures.job_error = job.error();
  if (const int64_t loading = EnteredMicros(job, "LOADING"),
      running = EnteredMicros(job, "RUNNING");
      loading > 0 && running > 0) {
    figures.loading_to_running_s = (running - loading) / 1e6;
  }
  figures.rss_mib_launched = coordinator->Status("VmRSS") / 1024.0;
  FakeFleet::Figures launched = fleet.GetFigures();
  figures.start_job_bytes_per_host =
      launched.start_job_calls > 0 ? launched.start_job_bytes / launched.start_job_calls : 0;
  figures.start_job_max_bytes = launched.start_job_max_bytes;
  figures.worst_heartbeat_launch_s = absl::ToDoubleSeconds(launched.worst_heartbeat);

  if (job.state() == v1::JOB_STATE_RUNNING && fleet.AwaitStarted(job_id, absl::Seconds(10))) {
    // Telemetry: every host uploads each step, one watcher reads the global summaries.
    fleet.ResetHeartbeatFigures();
    WatchFleet::Config watch{.address = coordinator->address(), .watchers = 1, .channels = 1};
    watch.request.set_job_id(job_id);
    watch.expected_summaries = static_cast<size_t>(options.steps);
    WatchFleet watcher(watch);
    watcher.Start();
    absl::SleepFor(absl::Milliseconds(200));  // the stream is open before the first step
    cpu = coordinator->CpuSeconds();
    const absl::Time start = absl::Now();
    for (int step = 1; step <= options.steps; ++step) {
      absl::SleepFor(start + options.step_period * step - absl::Now());
      fleet.UploadStep(job_id, step);
    }
    watcher.AwaitReceived(options.steps, options.step_period + absl::Seconds(10));
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    const double telemetry_cpu =
        std::max(0.0, coordinator->CpuSeconds() - cpu - idle_rate * seconds);
    figures.global_summaries = watcher.TotalReceived();
    figures.summary_breaks = watcher.readers().front()->breaks;
    figures.telemetry_cpu_per_step_ms = telemetry_cpu * 1e3 / options.steps;
    figures.telemetry_cpu_per_summary_us =
        telemetry_cpu * 1e6 / (static_cast<double>(options.steps) * options.hosts);
    figures.summary_latency_p50_ms = watcher.LatencyPercentile(50) / 1e3;
    figures.summary_latency_p99_ms = watcher.LatencyPercentile(99) / 1e3;
    figures.worst_heartbeat_telemetry_s =
        absl::ToDoubleSeconds(fleet.GetFigures().worst_heartbeat);
  }

  // Who the coordinator still counts alive, then the job's end.
  v1::ListWorkersResponse workers;
  grpc::ClientContext list_context;
  RETURN_IF_ERROR(FromGrpc(stub->ListWorkers(WithDeadline(list_context, absl::Seconds(30)),
                                             v1::ListWorkersRequest(), &workers),
                           "ListWorkers"));
  for (const v1::WorkerStatus& worker : workers.workers()) {
    if (worker.state() != v1::WORKER_STATE_ALIVE) ++figures.hosts_not_alive;
  }
  figures.hosts_not_alive += options.hosts - workers.workers_size();
  std::vector<double> scrapes;
  cpu = coordinator->CpuSeconds();
  for (int i = 0; i < 3; ++i) {
    grpc::ClientContext metrics_context;
    v1::GetMetricsResponse metrics;
    const absl::Time asked = absl::Now();
    RETURN_IF_ERROR(FromGrpc(stub->GetMetrics(WithDeadline(metrics_context, absl::Seconds(30)),
                                              v1::GetMetricsRequest(), &metrics),
                             "GetMetrics"));
    scrapes.push_back(absl::ToDoubleMilliseconds(absl::Now() - asked));
  }
  figures.metrics_scrape_cpu_ms = (coordinator->CpuSeconds() - cpu) * 1e3 / 3;
  std::sort(scrapes.begin(), scrapes.end());
  figures.metrics_scrape_ms = scrapes[1];
  grpc::ClientContext cancel_context;
  v1::CancelJobRequest cancel;
  cancel.set_job_id(job_id);
  v1::CancelJobResponse cancelled;
  stub->CancelJob(WithDeadline(cancel_context, absl::Seconds(30)), cancel, &cancelled);
  const FakeFleet::Figures end = fleet.GetFigures();
  figures.heartbeat_errors = end.heartbeat_errors;
  figures.summaries_refused = end.summaries_refused;
  figures.fleet_error = end.last_error;
  return figures;
}

std::string DescribeFigures(const ScaleFigures& f) {
  return absl::StrFormat(
      "hosts %d: register %.3f ms CPU/host, RSS %.0f MiB; heartbeat %.0f us CPU/beat (%.1f%% "
      "of a core); launch %s in %.2f s (LOADING->RUNNING %.2f s), %d threads, StartJob %d "
      "bytes/host (max %d), worst heartbeat %.3f s, RSS %.0f MiB; telemetry %d summaries "
      "(%d breaks), %.2f ms CPU/step = %.1f us/host summary, latency p50 %.1f / p99 %.1f ms, "
      "worst heartbeat %.3f s; metrics scrape %.1f ms (%.1f ms CPU); %d heartbeats refused, "
      "%d hosts not alive, %d uploads refused%s%s%s%s",
      f.hosts, f.register_cpu_per_host_ms, f.rss_mib_registered, f.heartbeat_cpu_per_beat_us,
      f.heartbeat_core_share * 100, f.job_state, f.submit_to_running_s, f.loading_to_running_s,
      f.peak_threads, f.start_job_bytes_per_host, f.start_job_max_bytes,
      f.worst_heartbeat_launch_s, f.rss_mib_launched, f.global_summaries, f.summary_breaks,
      f.telemetry_cpu_per_step_ms, f.telemetry_cpu_per_summary_us, f.summary_latency_p50_ms,
      f.summary_latency_p99_ms, f.worst_heartbeat_telemetry_s, f.metrics_scrape_ms,
      f.metrics_scrape_cpu_ms, f.heartbeat_errors,
      f.hosts_not_alive, f.summaries_refused, f.job_error.empty() ? "" : "; job error: ",
      f.job_error, f.fleet_error.empty() ? "" : "; fleet saw: ", f.fleet_error);
}

}  // namespace meshrun::test_support
