// Upper bounds on every size a client controls in a JobSpec, and the checks of its declarations
// against one another (sharding, shard shapes, donation, the state's roles). docs/limits.md
// lists each bound with the error a client gets.
//
// Thread-safety: stateless; every function is safe to call concurrently.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/path_roots.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::jobspec {

struct SpecLimits {
  static constexpr int64_t kMaxNameBytes = 256;            // job, tensor and telemetry names
  static constexpr int64_t kMaxPathBytes = 4096;           // globs, bundle and checkpoint paths
  static constexpr int64_t kMaxPrograms = 5;               // init, step, grad, apply, eval
  static constexpr int64_t kMaxProgramBytes = int64_t{256} << 20;  // each program's StableHLO
  static constexpr int64_t kMaxCompileOptionsBytes = int64_t{1} << 20;
  static constexpr int64_t kMaxTensorsPerProgram = 16384;  // inputs, and outputs, of a program
  static constexpr int64_t kMaxRank = 16;
  static constexpr int64_t kMaxDimension = int64_t{1} << 40;
  static constexpr int64_t kMaxTensorElements = int64_t{1} << 40;    // global shape product
  static constexpr int64_t kMaxShardBytes = int64_t{1} << 36;        // one device's part: 64 GiB
  static constexpr int64_t kMaxTelemetry = 256;            // declared series
  static constexpr int64_t kMaxTelemetryElements = 65536;  // elements of one telemetry output
  static constexpr int64_t kMaxCadence = 1000000;          // telemetry_cadence
  static constexpr int64_t kMaxSteps = int64_t{1} << 40;
  static constexpr int64_t kMaxMeshSize = 65536;           // any mesh dimension
  static constexpr int64_t kMaxBatch = int64_t{1} << 24;   // data.global_batch, sequence_length
  static constexpr int64_t kMaxGradAccumulation = 65536;
  static constexpr int64_t kMaxRestarts = 100;
};

// INVALID_ARGUMENT "spec.<field> <problem>": how every check of a spec names what it refuses.
absl::Status Invalid(const std::string& field, const std::string& problem);

// The program output a telemetry series reads: its `output`, or its `name` where that is empty.
inline const std::string& TelemetryOutputName(const v1::TelemetryDeclaration& t) {
  return t.output().empty() ? t.name() : t.output();
}

// The element count of `dims`, or INVALID_ARGUMENT naming `field` when a dimension is negative or
// over kMaxDimension, or the product overflows or exceeds kMaxTensorElements.
absl::StatusOr<int64_t> CheckedElements(const std::vector<int64_t>& dims,
                                        const std::string& field);

// Every size, count and name length against SpecLimits, before anything else reads the spec.
// Errors: INVALID_ARGUMENT "spec.<field> ..." naming the bound.
absl::Status CheckSpecBounds(const v1::JobSpec& spec);

// Each tensor's sharding (one axis per dimension, "data", "model" or "expert", or none) and
// shard_shape (one entry per dimension, dividing it: exactly it where unsplit); donated_inputs
// in range and distinct; the state (inputs [0, state_count)) returned in the same places with
// the same dtype and shapes, and made by init; telemetry outputs small. Call after
// ValidateJobSpec's own checks. Errors: INVALID_ARGUMENT naming the field and the fix.
absl::Status CheckDeclarations(const v1::JobSpec& spec);

// At planning: every axis a tensor is split over is one of the mesh's, and splits the dimension
// into exactly its shard_shape. `axis_names` and `axis_sizes` are the planned mesh.
// Errors: INVALID_ARGUMENT naming the tensor, the dimension and the mesh.
absl::Status CheckShardingFitsMesh(const v1::JobSpec& spec,
                                   const std::vector<std::string>& axis_names,
                                   const std::vector<int64_t>& axis_sizes);

// The paths a client names that the coordinator itself opens (the token shard glob and the
// array file it hashes for the data receipt, the checkpoint directory it commits into, the
// checkpoint resume_from names) must lie under `roots` (--data_root). Call before anything
// opens them.
// Errors: INVALID_ARGUMENT as PathRoots::Resolve, naming the spec field.
absl::Status CheckSpecPaths(const v1::JobSpec& spec, const PathRoots& roots);

// Every path of `spec` a worker opens: those of CheckSpecPaths plus the example bundle (its
// job.json or directory). The worker's StartJob calls it with its own --data_root.
// Errors: as CheckSpecPaths.
absl::Status CheckWorkerSpecPaths(const v1::JobSpec& spec, const PathRoots& roots);

}  // namespace meshrun::jobspec
