#include "runtime/compile_target.h"

#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace meshrun::runtime {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Published per-chip figures: v5e 16 GiB HBM and 197 TFLOP/s bf16, v6e 32 GiB and 918.
const std::vector<ChipSpec>& Chips() {
  static const auto* chips = new std::vector<ChipSpec>{
      {.generation = "v5e", .device_kind = "TPU v5 lite", .hbm_bytes = 16 * kGiB,
       .peak_bf16_flops = 197e12},
      {.generation = "v6e", .device_kind = "TPU v6 lite", .hbm_bytes = 32 * kGiB,
       .peak_bf16_flops = 918e12},
  };
  return *chips;
}

// Slice shapes of the 2-D generations (v5e, v6e), by chip count: the topology libtpu names.
const std::map<int, std::string>& SliceShapes() {
  static const auto* shapes = new std::map<int, std::string>{
      {1, "1x1"}, {4, "2x2"}, {8, "2x4"}, {16, "4x4"}, {32, "4x8"}, {64, "8x8"},
      {128, "8x16"}, {256, "16x16"}};
  return *shapes;
}

std::string SliceSizes() {
  std::vector<int> sizes;
  for (const auto& [chips, shape] : SliceShapes()) sizes.push_back(chips);
  return absl::StrJoin(sizes, ", ");
}

// Chips of one host: a slice of up to 8 chips is one host; larger ones are hosts of 4.
std::vector<int64_t> HostBounds(int chips_per_host) {
  switch (chips_per_host) {
    case 1: return {1, 1, 1};
    case 4: return {2, 2, 1};
    case 8: return {2, 4, 1};
    default: return {};
  }
}

absl::StatusOr<CompileTarget> MakeTarget(const ChipSpec& chip, int chips, int chips_per_host,
                                         int num_slices) {
  const auto shape = SliceShapes().find(chips);
  if (shape == SliceShapes().end()) {
    return absl::InvalidArgumentError(absl::StrCat(chip.generation, " slices have ",
                                                   SliceSizes(), " chips, not ", chips));
  }
  std::vector<int64_t> bounds = HostBounds(chips_per_host);
  if (bounds.empty() || chips % chips_per_host != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        chip.generation, " hosts have 1, 4 or 8 chips dividing the slice, not ", chips_per_host,
        " of ", chips));
  }
  CompileTarget target;
  target.name = absl::StrCat(num_slices > 1 ? absl::StrCat(num_slices, "x") : "",
                             chip.generation, "-", chips);
  target.chip = chip;
  target.chips_per_slice = chips;
  target.num_slices = num_slices;
  target.chips_per_host = chips_per_host;
  target.topology_name = absl::StrCat(chip.generation, ":", shape->second);
  target.chips_per_host_bounds = std::move(bounds);
  return target;
}

}  // namespace

std::optional<ChipSpec> ChipByGeneration(absl::string_view generation) {
  for (const ChipSpec& chip : Chips()) {
    if (chip.generation == generation) return chip;
  }
  return std::nullopt;
}

std::optional<ChipSpec> ChipByDeviceKind(absl::string_view device_kind) {
  for (const ChipSpec& chip : Chips()) {
    if (chip.device_kind == device_kind) return chip;
  }
  return std::nullopt;
}

absl::StatusOr<CompileTarget> ParseCompileTarget(absl::string_view name) {
  const std::string usage = absl::StrCat(
      "a compile target is <generation>-<chips> or <slices>x<generation>-<chips> (v6e-8, "
      "v6e-16, 2xv6e-8; generations v5e, v6e; chips ",
      SliceSizes(), ")");
  absl::string_view rest = name;
  int num_slices = 1;
  if (const size_t x = rest.find('x'); x != absl::string_view::npos && x > 0 &&
                                       absl::SimpleAtoi(rest.substr(0, x), &num_slices)) {
    rest = rest.substr(x + 1);
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(rest, '-');
  int chips = 0;
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[1], &chips) || num_slices < 1) {
    return absl::InvalidArgumentError(absl::StrCat("target \"", name, "\": ", usage));
  }
  const std::optional<ChipSpec> chip = ChipByGeneration(parts[0]);
  if (!chip) {
    return absl::InvalidArgumentError(
        absl::StrCat("target \"", name, "\": unknown TPU generation \"", parts[0], "\"; ", usage));
  }
  absl::StatusOr<CompileTarget> target = MakeTarget(*chip, chips, chips <= 8 ? chips : 4,
                                                    num_slices);
  if (!target.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("target \"", name, "\": ", target.status().message(), "; ", usage));
  }
  return target;
}

absl::StatusOr<CompileTarget> TargetForHosts(absl::string_view device_kind, int hosts_per_slice,
                                             int devices_per_host, int num_slices) {
  const std::optional<ChipSpec> chip = ChipByDeviceKind(device_kind);
  if (!chip) {
    return absl::InvalidArgumentError(absl::StrCat(
        "no compile target for devices of kind \"", device_kind, "\" (known: TPU v5 lite, ",
        "TPU v6 lite)"));
  }
  return MakeTarget(*chip, hosts_per_slice * devices_per_host, devices_per_host,
                    std::max(num_slices, 1));
}

absl::Status CheckFits(absl::string_view program, const CompiledMemory& memory,
                       const ChipSpec& chip) {
  if (memory.DeviceBytes() <= chip.hbm_bytes) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "program ", program, " needs ", FormatBytes(memory.DeviceBytes()), " per device (arguments ",
      FormatBytes(memory.argument_bytes), " + outputs ", FormatBytes(memory.output_bytes),
      " - aliased ", FormatBytes(memory.alias_bytes), " + temporaries ",
      FormatBytes(memory.temp_bytes), " + code ", FormatBytes(memory.generated_code_bytes),
      "); a ", chip.generation, " chip has ", FormatBytes(chip.hbm_bytes),
      " of HBM: shard the state over more devices or shrink the batch"));
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  char out[32];
  if (bytes >= kGiB) {
    snprintf(out, sizeof(out), "%.2f GiB", b / kGiB);
  } else if (bytes >= (1 << 20)) {
    snprintf(out, sizeof(out), "%.1f MiB", b / (1 << 20));
  } else if (bytes >= 1024) {
    snprintf(out, sizeof(out), "%.1f KiB", b / 1024);
  } else {
    return absl::StrCat(bytes, " B");
  }
  return out;
}

}  // namespace meshrun::runtime
