// meshrun-worker: one per host. Registers with the coordinator, heartbeats, and (as later
// capabilities land) loads executables and runs steps. Runs until SIGTERM or SIGINT.
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "rpc/binary_setup.h"
#include "worker_service/gce_metadata.h"
#include "rpc/server_support.h"
#include "rpc/tls_credentials.h"
#include "worker_service/worker_server.h"
#include "worker/host_identity.h"
#include "runtime/backends.h"
#include "runtime/megascale.h"
#include "runtime/runtime_setup.h"

ABSL_FLAG(std::string, listen, "",
          "HOST:PORT to serve on; port 0 picks a free port; default [::]:7071 with TLS, "
          "127.0.0.1:7071 without (other plaintext addresses need --insecure)");
ABSL_FLAG(std::string, advertise_address, "",
          "HOST:PORT the coordinator uses to reach this worker; default: the listen host "
          "(the host name for a wildcard listen address) and the bound port");
ABSL_FLAG(std::string, coordinator, "127.0.0.1:7070", "HOST:PORT of the coordinator");
ABSL_FLAG(std::string, host, "",
          "this worker's host name; default TPU_WORKER_HOSTNAMES[TPU_WORKER_ID] or the "
          "machine's host name");
ABSL_FLAG(std::string, tpu_metadata, "auto",
          "where TPU variables absent from the environment come from: \"auto\" (the GCE "
          "metadata server, $GCE_METADATA_IP or metadata.google.internal, when the plugin is "
          "libtpu and TPU_WORKER_ID is unset), \"off\", or a metadata server HOST:PORT");
ABSL_FLAG(int, worker_index, 0, "index of this host in its slice (TPU_WORKER_ID wins)");
ABSL_FLAG(int, slice_id, 0, "slice of this host (MEGASCALE_SLICE_ID wins)");
ABSL_FLAG(int, num_slices, 1, "number of slices (MEGASCALE_NUM_SLICES wins)");
ABSL_FLAG(std::string, megascale_coordinator, "",
          "multislice (num_slices > 1): host name of slice 0's worker 0, where libtpu's "
          "megascale coordinator runs (MEGASCALE_COORDINATOR_ADDRESS wins); default on slice 0: "
          "TPU_WORKER_HOSTNAMES[0], or this host as worker 0");
ABSL_FLAG(int, megascale_port, meshrun::runtime::kDefaultMegascalePort,
          "multislice: the megascale coordinator's port (MEGASCALE_PORT wins)");
ABSL_FLAG(std::string, state_dir, "",
          "directory for the local executable cache; default "
          "$XDG_STATE_HOME/meshrun/worker-<host> or ~/.local/state/meshrun/worker-<host>");
ABSL_FLAG(std::string, pjrt_plugin, meshrun::runtime::DefaultPjrtPluginPath(),
          "PJRT plugin to run with: libtpu.so on TPU hosts, XLA's CPU plugin elsewhere");
ABSL_FLAG(int64_t, cpu_devices, 8, "CPU plugin only: number of CPU devices");
ABSL_FLAG(bool, spare, false,
          "register as a hot spare: kept out of a job's first placement, it takes a lost "
          "host's place when a job restarts (docs/checkpoints.md)");
ABSL_FLAG(int64_t, memory_checkpoint_bytes, 0,
          "host memory in-memory checkpoints may fill, bytes; 0: MemAvailable at start. A job "
          "whose checkpoints would not fit is refused (docs/limits.md)");
ABSL_FLAG(absl::Duration, drain_timeout, absl::Seconds(10),
          "on SIGTERM, how long in-flight work may take before it is cancelled");
// limits (docs/limits.md)
ABSL_FLAG(std::string, data_root, "",
          "comma-separated directories (besides --state_dir; the flag may be repeated) where "
          "jobs' example bundles, token shards, array files and checkpoints may lie; a job "
          "naming any other path is refused");
ABSL_FLAG(absl::Duration, upload_idle_timeout, absl::Seconds(60),
          "an executable upload that sends nothing for this long is cancelled");
ABSL_FLAG(int64_t, executable_store_bytes, int64_t{32} << 30,
          "bytes of executables kept under --state_dir (least recently used go first; those "
          "used in the last 10 minutes stay)");

// The process environment, with the TPU variables it lacks from the GCE metadata server
// (worker_service/gce_metadata.h) as --tpu_metadata says.
meshrun::worker::EnvLookup TpuEnvironment() {
  meshrun::worker::EnvLookup env = meshrun::worker::ProcessEnvironment();
  std::string address = absl::GetFlag(FLAGS_tpu_metadata);
  if (address == "off") return env;
  if (address == "auto") {
    if (env("TPU_WORKER_ID").has_value() ||
        absl::GetFlag(FLAGS_pjrt_plugin).find("libtpu") == std::string::npos) {
      return env;
    }
    address = env("GCE_METADATA_IP").value_or("metadata.google.internal");
  }
  return meshrun::services::WithTpuMetadata(
      env, meshrun::services::GceMetadataFetch(address, absl::Seconds(5)));
}

int main(int argc, char** argv) {
  using meshrun::services::ExitWithError;
  std::vector<std::string> args = meshrun::services::InitBinary(
      "meshrun-worker",
      "meshrun-worker [flags]\n\nRuns one host's share of meshrun jobs and reports to the "
      "coordinator.",
      argc, argv);
  if (args.size() > 1) {
    ExitWithError("unexpected argument \"" + args[1] + "\"; see --help", 2);
  }
  meshrun::services::TerminationSignalWatch signals("meshrun-worker");
  signals.SetStage("resolving this host's TPU identity");
  const meshrun::worker::EnvLookup tpu_env = TpuEnvironment();
  auto identity = meshrun::worker::ResolveHostIdentity(
      {.host = absl::GetFlag(FLAGS_host),
       .slice_id = absl::GetFlag(FLAGS_slice_id),
       .num_slices = absl::GetFlag(FLAGS_num_slices),
       .worker_index = absl::GetFlag(FLAGS_worker_index)},
      tpu_env);
  if (!identity.ok()) ExitWithError(std::string(identity.status().message()), 2);
  const std::string plugin = absl::GetFlag(FLAGS_pjrt_plugin);
  if (meshrun::services::PluginPlatformOf(plugin) == meshrun::services::PluginPlatform::kTpu) {
    // libtpu reads these when the client is created; given here, it does not poll the metadata
    // server for minutes on a host that is not a TPU VM.
    std::string exported;
    for (const auto& [name, value] : meshrun::worker::TpuRuntimeVariables(
             *identity, tpu_env, meshrun::worker::ProcessEnvironment())) {
      setenv(name.c_str(), value.c_str(), 1);
      absl::StrAppend(&exported, " ", name, "=", value);
    }
    if (!exported.empty()) spdlog::info("libtpu gets{}", exported);
  }
  // Multislice: libtpu reads MEGASCALE_* when the runtime is created (WorkerServer::Start).
  auto megascale = meshrun::runtime::ResolveMegascale(
      {.host = identity->host,
       .slice_id = identity->slice_id,
       .num_slices = identity->num_slices,
       .worker_index = identity->worker_index,
       .slice_hostnames = identity->slice_hostnames,
       .flag_coordinator = absl::GetFlag(FLAGS_megascale_coordinator),
       .flag_port = absl::GetFlag(FLAGS_megascale_port)},
      meshrun::worker::ProcessEnvironment());
  if (!megascale.ok()) ExitWithError(std::string(megascale.status().message()), 2);
  if (megascale->has_value()) {
    if (absl::Status s = meshrun::runtime::ExportMegascaleEnvironment(**megascale); !s.ok()) {
      ExitWithError(std::string(s.message()), 1);
    }
    std::string variables;
    for (const auto& [name, value] : meshrun::runtime::MegascaleEnvironment(**megascale)) {
      absl::StrAppend(&variables, " ", name, "=", value);
    }
    spdlog::info("multislice: slice {} of {}; the runtime gets{}", identity->slice_id,
                 identity->num_slices, variables);
  }
  std::string state_dir = absl::GetFlag(FLAGS_state_dir);
  if (state_dir.empty()) {
    state_dir = meshrun::services::DefaultStateDir("worker-" + identity->host);
  }
  signals.SetStage(absl::StrCat("loading ", plugin, " and starting the server"));
  auto server = meshrun::services::WorkerServer::Start(
      {.listen = absl::GetFlag(FLAGS_listen).empty()
                     ? meshrun::services::DefaultListenAddress(7071)
                     : absl::GetFlag(FLAGS_listen),
       .advertise_address = absl::GetFlag(FLAGS_advertise_address),
       .coordinator = absl::GetFlag(FLAGS_coordinator),
       .identity = *identity,
       .state_dir = state_dir,
       .pjrt_plugin = plugin,
       .cpu_devices = absl::GetFlag(FLAGS_cpu_devices),
       .upload_idle_timeout = absl::GetFlag(FLAGS_upload_idle_timeout),
       .executable_store_bytes = absl::GetFlag(FLAGS_executable_store_bytes),
       // `meshrun drain <host>`: the same path as systemctl stop (SIGTERM, awaited below).
       .on_drain_request = [] { kill(getpid(), SIGTERM); },
       .data_roots = meshrun::services::RepeatedFlagValues("data_root",
                                                           absl::GetFlag(FLAGS_data_root)),
       .spare = absl::GetFlag(FLAGS_spare),
       .memory_checkpoint_bytes = absl::GetFlag(FLAGS_memory_checkpoint_bytes)});
  if (!server.ok()) ExitWithError(std::string(server.status().message()), 1);
  signals.MarkStarted();
  const int signal = signals.Wait();
  const absl::Duration drain = absl::GetFlag(FLAGS_drain_timeout);
  spdlog::info("signal {}: draining (deadline {})", signal, absl::FormatDuration(drain));
  (*server)->Drain(drain);
  spdlog::info("stopped");
  return 0;
}
