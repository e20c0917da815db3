// One device's block of a global array under an SPMD sharding: how the worker splits the
// global batches it reads into per-device uploads. Pure; thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/types.h"

namespace meshrun::runtime {

// The block of `global` that mesh partition `partition` holds under `sharding`.
// Errors: INVALID_ARGUMENT (unknown axis, dimension not divisible).
absl::StatusOr<HostArray> ShardOf(const HostArray& global, const std::vector<std::string>& sharding,
                                  const std::vector<std::string>& mesh_axes,
                                  const std::vector<int64_t>& mesh_shape, int partition);

}  // namespace meshrun::runtime
