// meshrun-coordinator: the control plane's server. Runs until SIGTERM or SIGINT, then drains.
#include <spdlog/spdlog.h>

#include <malloc.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_join.h"
#include "rpc/binary_setup.h"
#include "coordinator_service/coordinator_limit_flags.h"
#include "coordinator_service/coordinator_server.h"
#include "rpc/server_support.h"
#include "rpc/tls_credentials.h"
#include "runtime/backends.h"

ABSL_FLAG(std::string, listen, "",
          "HOST:PORT to serve on; port 0 picks a free port; default [::]:7070 with TLS, "
          "127.0.0.1:7070 without (other plaintext addresses need --insecure)");
ABSL_FLAG(std::string, state_dir, "",
          "directory for persistent state (executable cache, telemetry history); default "
          "$XDG_STATE_HOME/meshrun/coordinator or ~/.local/state/meshrun/coordinator");
ABSL_FLAG(absl::Duration, heartbeat_timeout, absl::Seconds(10),
          "a worker silent for this long is DEAD; workers heartbeat every half of it");
ABSL_FLAG(absl::Duration, hang_timeout, absl::ZeroDuration(),
          "a running job none of whose hosts completed a step for this long FAILS, naming the "
          "host that stopped first; also bounds the host replicas' all-reduce; 0: off (the "
          "all-reduce waits up to 60s)");
ABSL_FLAG(std::string, pjrt_plugin, meshrun::runtime::DefaultPjrtPluginPath(),
          "PJRT plugin the coordinator compiles with (the workers' plugin); empty: no compiling");
ABSL_FLAG(std::string, http_listen, "",
          "HOST:PORT for HTTP: the web dashboard at /, Prometheus text at /metrics (e.g. "
          "127.0.0.1:7080; port 0 picks a free port, logged); empty: no HTTP");
ABSL_FLAG(int32_t, http_max_streams, 8,
          "dashboard event streams (/api/watch) open at once, of identities other than admin; "
          "more get 503");
ABSL_FLAG(int32_t, http_max_streams_per_identity, 2,
          "dashboard event streams one identity (a token, a certificate) may hold open; more "
          "get 429");
ABSL_FLAG(int32_t, http_max_admin_streams, 2,
          "dashboard event streams of admin identities, counted apart from everyone else's");
ABSL_FLAG(std::string, web_root, "",
          "folder of the dashboard's built assets; default: web/ next to the binary's folder "
          "(build/web in a checkout), else share/meshrun/web there (an install)");
ABSL_FLAG(int64_t, cpu_devices, 8, "CPU plugin only: devices of the compiling client");
ABSL_FLAG(std::string, tpu_compiler_plugin, "",
          "libtpu.so to compile TPU jobs with, for the slice their workers form, on this host "
          "(no TPU needed); used when it is the workers' own libtpu (same sha256); empty: TPU "
          "jobs compile on their first worker");
ABSL_FLAG(absl::Duration, restart_wait, absl::Seconds(60),
          "automatic recovery: how long a job restarting from its checkpoint waits for enough "
          "healthy hosts (the same host back, or a spare) before it fails");
ABSL_FLAG(int32_t, telemetry_relay_hosts, 64,
          "a job of more hosts than this has its telemetry relayed: its hosts in groups of "
          "this many, each group's first host forwarding the group's summaries in batches "
          "(docs/scale.md); 0: every host uploads its own");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(10),
          "on SIGTERM, how long in-flight calls may take before they are cancelled");

int main(int argc, char** argv) {
  using meshrun::services::ExitWithError;
  std::vector<std::string> args = meshrun::services::InitBinary(
      "meshrun-coordinator",
      "meshrun-coordinator [flags]\n\nServes the meshrun control plane: workers register here, "
      "jobs are submitted here, telemetry is combined here.",
      argc, argv);
  if (args.size() > 1) {
    ExitWithError("unexpected argument \"" + args[1] + "\"; see --help", 2);
  }
  std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir.empty()) state_dir = meshrun::services::DefaultStateDir("coordinator");
  std::string web_root = absl::GetFlag(FLAGS_web_root);
  if (web_root.empty()) {
    std::error_code error;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
    // A build tree keeps the assets in <build>/web; an install in <prefix>/share/meshrun/web.
    const std::filesystem::path prefix = exe.parent_path().parent_path();
    if (!error) web_root = (prefix / "web").string();
    if (!error && !std::filesystem::exists(prefix / "web" / "index.html") &&
        std::filesystem::exists(prefix / "share" / "meshrun" / "web" / "index.html")) {
      web_root = (prefix / "share" / "meshrun" / "web").string();
    }
  }
  meshrun::services::TerminationSignalWatch signals("meshrun-coordinator");
  signals.SetStage("loading the PJRT plugin and starting the server");
  auto server = meshrun::services::CoordinatorServer::Start(
      {.listen = absl::GetFlag(FLAGS_listen).empty()
                     ? meshrun::services::DefaultListenAddress(7070)
                     : absl::GetFlag(FLAGS_listen),
       .state_dir = state_dir,
       .heartbeat_timeout = absl::GetFlag(FLAGS_heartbeat_timeout),
       .pjrt_plugin = absl::GetFlag(FLAGS_pjrt_plugin),
       .cpu_devices = absl::GetFlag(FLAGS_cpu_devices),
       .tpu_compiler_plugin = absl::GetFlag(FLAGS_tpu_compiler_plugin),
       .http_listen = absl::GetFlag(FLAGS_http_listen),
       .web_root = web_root,
       .http_max_streams = absl::GetFlag(FLAGS_http_max_streams),
       .http_max_streams_per_identity = absl::GetFlag(FLAGS_http_max_streams_per_identity),
       .http_max_admin_streams = absl::GetFlag(FLAGS_http_max_admin_streams),
       .restart_wait = absl::GetFlag(FLAGS_restart_wait),
       .hang_timeout = absl::GetFlag(FLAGS_hang_timeout),
       .telemetry_relay_hosts = absl::GetFlag(FLAGS_telemetry_relay_hosts),
       .limits = meshrun::services::CoordinatorLimitsFromFlags()});
  if (!server.ok()) ExitWithError(std::string(server.status().message()), 1);
  // limits: gRPC frees a refused oversized request's buffers, but glibc keeps their pages;
  // handing them back every 10 s keeps one such request from holding the RSS up.
  std::thread([] {
    while (true) {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      malloc_trim(0);
    }
  }).detach();
  signals.MarkStarted();
  const int signal = signals.Wait();
  const absl::Duration drain = absl::GetFlag(FLAGS_drain_timeout);
  spdlog::info("signal {}: draining (deadline {})", signal, absl::FormatDuration(drain));
  (*server)->Drain(drain);
  spdlog::info("stopped");
  return 0;
}
