// Where this worker sits in a TPU slice: host name, slice id and worker index.
//
// On Cloud TPU VMs the runtime environment names them (TPU_WORKER_ID, TPU_WORKER_HOSTNAMES,
// MEGASCALE_SLICE_ID, MEGASCALE_NUM_SLICES); an environment value wins over a flag, since
// flags are usually left at their defaults on TPU hosts. Pure function; thread-safe.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace meshrun::worker {

struct HostIdentity {
  std::string host;
  int slice_id = 0;
  int num_slices = 1;
  int worker_index = 0;
  std::vector<std::string> slice_hostnames;  // every host of this slice, by worker index
};

// Reads an environment variable; std::nullopt when unset. Injected so tests need no setenv.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup ProcessEnvironment();

// `flags` supplies defaults; an empty flags.host means "TPU_WORKER_HOSTNAMES[worker_index]
// when given, else the machine's host name".
// Errors: INVALID_ARGUMENT naming the variable or flag that is malformed or inconsistent
// (not an integer, negative, worker index outside the host list, slice id >= slice count).
absl::StatusOr<HostIdentity> ResolveHostIdentity(const HostIdentity& flags,
                                                 const EnvLookup& env);

// What libtpu reads at client creation, from the identity resolved above, for each variable
// `process_env` lacks: TPU_WORKER_ID, TPU_WORKER_HOSTNAMES (the slice's hosts, or this host),
// TPU_ACCELERATOR_TYPE (when `resolved` has it, e.g. from the metadata server), and
// TPU_SKIP_MDS_QUERY=1 so libtpu does not ask the metadata server again. (name, value) pairs.
std::vector<std::pair<std::string, std::string>> TpuRuntimeVariables(const HostIdentity& identity,
                                                                     const EnvLookup& resolved,
                                                                     const EnvLookup& process_env);

}  // namespace meshrun::worker
