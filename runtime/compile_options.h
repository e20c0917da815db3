// Builds the serialized XLA CompileOptions that PJRT_Client_Compile expects, from the few
// facts meshrun decides: replica and partition counts, SPMD partitioning, the device
// assignment the coordinator chose, and the process layout.
//
// The bytes are written with meshrun's own wire-compatible subset of XLA's message
// (xla_compile_options.proto); fields meshrun does not set take the plugin's defaults.
// Thread-safety: free functions, safe to call concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace meshrun::runtime {

struct CompileOptionsSpec {
  int num_replicas = 1;
  int num_partitions = 1;
  bool use_spmd_partitioning = true;
  // JAX >= 0.7 exports Shardy (`sdy`) shardings; XLA must partition them with Shardy.
  bool use_shardy_partitioner = true;
  // device_assignment[replica][partition] = global device id. Empty: the plugin picks.
  std::vector<std::vector<int64_t>> device_assignment;
  int process_index = 0;
  int process_count = 1;
  // XLA optimisation flags (kUserXlaFlags only) and their bool or integer values.
  std::map<std::string, std::variant<bool, int64_t>> xla_flags;

  friend bool operator==(const CompileOptionsSpec&, const CompileOptionsSpec&) = default;
};

// One replica, one partition per device, partition i on device_ids[i] (the coordinator's mesh
// order). With one id this is a single-device program.
CompileOptionsSpec SpmdCompileOptions(std::vector<int64_t> device_ids);

// Errors: INVALID_ARGUMENT when counts are not positive, the assignment's shape is not
// [num_replicas][num_partitions], an id is negative or repeated, or process_index is out of
// [0, process_count).
absl::StatusOr<std::string> BuildCompileOptions(const CompileOptionsSpec& spec);

// Reads back the fields meshrun sets from serialized CompileOptions (also JAX's, whose other
// fields are ignored). Errors: INVALID_ARGUMENT when the bytes are not a CompileOptions message.
absl::StatusOr<CompileOptionsSpec> ParseCompileOptions(absl::string_view bytes);

// The XLA flags a job's compile options may set: optimisation switches that change how a
// program is scheduled and fused, never where anything is read or written.
bool IsUserXlaFlag(absl::string_view name);

// Compile options that came from a client, checked against what meshrun lets a user set
// (security: the options reach the compiler, and XLA's debug options name files it writes):
// replica and partition counts, SPMD and Shardy partitioning, the device assignment, and
// IsUserXlaFlag flags with bool or integer values. Returns the options rebuilt from those
// fields alone, so nothing else a client wrote reaches a compiler.
// Errors: INVALID_ARGUMENT naming `field` and the first field or flag outside the list (its
// XLA name where known), or as BuildCompileOptions.
absl::StatusOr<std::string> RebuildClientCompileOptions(absl::string_view bytes,
                                                        const std::string& field);

// `bytes` reduced to the fields meshrun models, re-serialized deterministically: options that
// agree on everything meshrun sets give equal results. Errors: as ParseCompileOptions.
absl::StatusOr<std::string> CanonicalCompileOptions(absl::string_view bytes);

}  // namespace meshrun::runtime
