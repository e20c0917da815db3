// Multislice settings for libtpu: the MEGASCALE_* environment.
//
// On a multislice TPU job (num_slices > 1) libtpu connects the slices over the data-center
// network (DCN) itself, at PJRT client creation, from four environment variables: the address
// of the megascale coordinator (slice 0's worker 0), the port it listens on, this host's slice
// id and the number of slices. GKE's JobSet and Cloud TPU queued resources set them; on bare
// TPU VMs the worker derives them from its flags (docs/deploy.md, "Multislice").
//
// The worker exports them into its own process environment before it loads the plugin; the
// coordinator's planner computes what each host of a job should have (MeshPlan::megascale)
// so `meshrun get` shows it beside the mesh.
//
// Thread-safety: pure functions, except ExportMegascaleEnvironment (setenv: call it before any
// thread that reads the environment starts, i.e. before the runtime is created).
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace meshrun::runtime {

// libtpu's conventional megascale port (GKE's JobSet examples use it too).
inline constexpr int kDefaultMegascalePort = 8080;

struct MegascaleConfig {
  std::string coordinator_address;  // host (no port) of slice 0's worker 0
  int port = kDefaultMegascalePort;
  int slice_id = 0;
  int num_slices = 1;
};

// The variables, in name order: MEGASCALE_COORDINATOR_ADDRESS, MEGASCALE_NUM_SLICES,
// MEGASCALE_PORT, MEGASCALE_SLICE_ID.
std::vector<std::pair<std::string, std::string>> MegascaleEnvironment(
    const MegascaleConfig& config);

// What a worker hands libtpu. std::nullopt for a single slice (nothing to set).
// The environment wins over flags (as for the TPU identity): MEGASCALE_COORDINATOR_ADDRESS
// (a trailing ":port" there is taken as the port unless MEGASCALE_PORT is set), MEGASCALE_PORT;
// then `flag_coordinator` / `flag_port`; then, on slice 0 only, the first of
// `slice_hostnames` (TPU_WORKER_HOSTNAMES), or `host` itself when it is worker 0.
// Errors: INVALID_ARGUMENT naming the variable or flag: a port that is not 1..65535, an empty
// or malformed address, or a host outside slice 0 with no coordinator address given.
struct MegascaleInputs {
  std::string host;
  int slice_id = 0;
  int num_slices = 1;
  int worker_index = 0;
  std::vector<std::string> slice_hostnames;
  std::string flag_coordinator;  // --megascale_coordinator
  int flag_port = kDefaultMegascalePort;  // --megascale_port
};
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;
absl::StatusOr<std::optional<MegascaleConfig>> ResolveMegascale(const MegascaleInputs& inputs,
                                                                const EnvironmentLookup& env);

// setenv()s every variable of MegascaleEnvironment(config), overwriting.
// Errors: INTERNAL when setenv fails.
absl::Status ExportMegascaleEnvironment(const MegascaleConfig& config);

}  // namespace meshrun::runtime
