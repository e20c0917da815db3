// Compile targets: the TPU slices a program can be compiled for on a machine that has none
// ("v6e-8", "v6e-16", "2xv6e-8"), what their chips hold and compute, and what a compiled
// program needs of them (fit and FLOPs, from the compiler's own analysis).
//
// A target names the PJRT topology libtpu builds for it (PJRT_TopologyDescription_Create):
// "v6e:2x4" with chips_per_host_bounds and num_slices, as JAX's get_topology_desc and
// MaxText's train_compile pass them. Pure values and functions; thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace meshrun::runtime {

// One TPU generation as the compiler and MFU see it. Figures are the vendor's per chip.
struct ChipSpec {
  std::string generation;   // "v6e"
  std::string device_kind;  // what PJRT reports: "TPU v6 lite"
  int64_t hbm_bytes = 0;    // per chip (one device per chip on v5e and v6e)
  double peak_bf16_flops = 0;  // per chip per second, dense bf16
};

// The chip of a generation ("v6e", "v5e") or of a PJRT device kind ("TPU v6 lite").
// std::nullopt when meshrun has no figures for it.
std::optional<ChipSpec> ChipByGeneration(absl::string_view generation);
std::optional<ChipSpec> ChipByDeviceKind(absl::string_view device_kind);

struct CompileTarget {
  std::string name;  // "v6e-8", "2xv6e-16"
  ChipSpec chip;
  int chips_per_slice = 0;
  int num_slices = 1;
  int chips_per_host = 0;
  std::string topology_name;                 // "v6e:2x4"
  std::vector<int64_t> chips_per_host_bounds;  // {2, 4, 1}

  int devices() const { return chips_per_slice * num_slices; }
  int hosts() const { return devices() / chips_per_host; }
};

// "v6e-8" (one host of 8 chips), "v6e-16" (4 hosts of 4), "2xv6e-8" (two slices), and "v5e-…"
// alike. Errors: INVALID_ARGUMENT naming the target and the accepted forms and sizes.
absl::StatusOr<CompileTarget> ParseCompileTarget(absl::string_view name);

// The target that `num_slices` slices of `hosts_per_slice` hosts with `devices_per_host`
// devices of `device_kind` form: what a coordinator compiles for once its workers registered.
// Errors: INVALID_ARGUMENT (a device kind or slice shape meshrun does not know, named).
absl::StatusOr<CompileTarget> TargetForHosts(absl::string_view device_kind, int hosts_per_slice,
                                             int devices_per_host, int num_slices);

// What a compiled program needs of each device (PJRT_Executable_GetCompiledMemoryStats).
struct CompiledMemory {
  int64_t argument_bytes = 0;
  int64_t output_bytes = 0;
  int64_t alias_bytes = 0;  // outputs that reuse an argument's memory (donation)
  int64_t temp_bytes = 0;
  int64_t generated_code_bytes = 0;
  // Arguments + outputs − aliased + temporaries + code: the device memory one execution holds.
  int64_t DeviceBytes() const {
    return argument_bytes + output_bytes - alias_bytes + temp_bytes + generated_code_bytes;
  }
};

// What the compiler knows of an executable before it runs. A figure the plugin does not
// report is absent; `unreported` then says which and why.
struct ExecutableStats {
  std::optional<CompiledMemory> memory;
  std::optional<double> flops;           // per device per execution (cost analysis "flops")
  std::optional<double> bytes_accessed;  // per device per execution
  std::string fingerprint;               // PJRT_Executable_Fingerprint; empty when none
  std::string unreported;
};

// OK when `memory` fits one device of `chip`; else RESOURCE_EXHAUSTED naming `program`, the
// bytes it needs (with the parts) and the bytes a chip has.
absl::Status CheckFits(absl::string_view program, const CompiledMemory& memory,
                       const ChipSpec& chip);

// "1.50 GiB" / "312.0 MiB" / "4.0 KiB" / "12 B".
std::string FormatBytes(int64_t bytes);

}  // namespace meshrun::runtime
