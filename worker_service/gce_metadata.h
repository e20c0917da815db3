// TPU host identity from the GCE metadata server, for TPU VMs whose environment lacks the TPU
// variables (docs/deploy.md). The attributes are the ones JAX's own cluster detection reads:
//   agent-worker-number       -> TPU_WORKER_ID
//   worker-network-endpoints  -> TPU_WORKER_HOSTNAMES (the third ':' field of each entry)
//   tpu-env (KEY: 'value' lines) -> MEGASCALE_SLICE_ID, MEGASCALE_NUM_SLICES
//   accelerator-type          -> TPU_ACCELERATOR_TYPE
//
// Thread-safety: the returned functions may be called from any thread.
#pragma once

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/host_identity.h"

namespace meshrun::services {

// Reads one instance attribute. Errors: NOT_FOUND (the server has no such attribute),
// UNAVAILABLE (unreachable or an unexpected answer; the address named).
using MetadataFetch = std::function<absl::StatusOr<std::string>(const std::string& attribute)>;

// GET http://<address>/computeMetadata/v1/instance/attributes/<attribute> with the header
// Metadata-Flavor: Google, each bounded by `timeout`. `address` is HOST or HOST:PORT.
MetadataFetch GceMetadataFetch(std::string address, absl::Duration timeout);

// `env`, where a TPU variable it lacks comes from the metadata attributes above (an attribute
// the server lacks or cannot give counts as unset). Each attribute is fetched at most once.
worker::EnvLookup WithTpuMetadata(worker::EnvLookup env, MetadataFetch fetch);

}  // namespace meshrun::services
