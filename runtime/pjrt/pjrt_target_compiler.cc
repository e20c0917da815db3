#include "runtime/pjrt/pjrt_target_compiler.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/clock.h"
#include "common/status_macros.h"
#include "runtime/pjrt/pjrt_api.h"
#include "xla/pjrt/c/pjrt_c_api.h"

namespace meshrun::runtime {
namespace {

using pjrt::Plugin;

void DestroyExecutable(const PJRT_Api* api, PJRT_Executable* executable) {
  PJRT_ARGS(PJRT_Executable_Destroy_Args, destroy);
  destroy.executable = executable;
  PJRT_CALL(api, PJRT_Executable_Destroy, destroy).IgnoreError();
}

class PjrtTargetCompiler final : public TargetCompiler {
 public:
  PjrtTargetCompiler(const Plugin* plugin, CompileTarget target, PJRT_TopologyDescription* topology)
      : plugin_(plugin), api_(plugin->api), target_(std::move(target)), topology_(topology) {}
  ~PjrtTargetCompiler() override {
    PJRT_ARGS(PJRT_TopologyDescription_Destroy_Args, destroy);
    destroy.topology = topology_;
    PJRT_CALL(api_, PJRT_TopologyDescription_Destroy, destroy).IgnoreError();
  }

  absl::Status Describe() {
    PJRT_ARGS(PJRT_TopologyDescription_PlatformName_Args, name);
    name.topology = topology_;
    RETURN_IF_ERROR(PJRT_CALL(api_, PJRT_TopologyDescription_PlatformName, name));
    PJRT_ARGS(PJRT_TopologyDescription_PlatformVersion_Args, version);
    version.topology = topology_;
    RETURN_IF_ERROR(PJRT_CALL(api_, PJRT_TopologyDescription_PlatformVersion, version));
    identity_ = RuntimeIdentity{
        .platform_name = std::string(name.platform_name, name.platform_name_size),
        .platform_version = std::string(version.platform_version, version.platform_version_size),
        .pjrt_api_major = static_cast<uint32_t>(api_->pjrt_api_version.major_version),
        .pjrt_api_minor = static_cast<uint32_t>(api_->pjrt_api_version.minor_version),
        .plugin_sha256 = plugin_->sha256};
    PJRT_ARGS(PJRT_TopologyDescription_GetDeviceDescriptions_Args, devices);
    devices.topology = topology_;
    RETURN_IF_ERROR(PJRT_CALL(api_, PJRT_TopologyDescription_GetDeviceDescriptions, devices));
    for (size_t i = 0; i < devices.num_descriptions; ++i) {
      ASSIGN_OR_RETURN(DeviceDescription d,
                       pjrt::DescribeDevice(api_, devices.descriptions[i],
                                            identity_.platform_name));
      devices_.push_back(std::move(d));
    }
    if (static_cast<int>(devices_.size()) != target_.devices()) {
      return absl::InternalError(absl::StrCat("the plugin's topology for ", target_.name, " has ",
                                              devices_.size(), " devices, expected ",
                                              target_.devices()));
    }
    return absl::OkStatus();
  }

  const CompileTarget& target() const override { return target_; }
  const RuntimeIdentity& identity() const override { return identity_; }
  const std::vector<DeviceDescription>& devices() const override { return devices_; }

  absl::StatusOr<TargetExecutable> Compile(const ProgramSource& program) override {
    const absl::Time start = RealClock().Now();
    PJRT_ARGS(PJRT_Program, source);
    source.code = const_cast<char*>(program.code.data());
    source.code_size = program.code.size();
    source.format = program.format.data();
    source.format_size = program.format.size();
    PJRT_ARGS(PJRT_Compile_Args, compile);
    compile.topology = topology_;
    compile.program = &source;
    compile.compile_options = program.compile_options.data();
    compile.compile_options_size = program.compile_options.size();
    absl::Status status = PJRT_CALL(api_, PJRT_Compile, compile);
    if (status.code() == absl::StatusCode::kUnknown) {
      return absl::InvalidArgumentError(absl::StrCat("program rejected for ", target_.name,
                                                     " (plugin code UNKNOWN): ", status.message()));
    }
    if (absl::StrContains(status.message(), "Ran out of memory in memory space hbm")) {
      // XLA:TPU's own fit check; its first line has the figures ("Used 32.00G of 31.25G hbm").
      const absl::string_view message = status.message();
      return absl::ResourceExhaustedError(absl::StrCat(
          "does not fit one ", target_.chip.generation, " chip's HBM (",
          FormatBytes(target_.chip.hbm_bytes), ", part reserved by the runtime): ",
          message.substr(0, message.find('\n')),
          " Shard the state over more devices or shrink the batch."));
    }
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat("compiling for ", target_.name, ": ",
                                                      status.message()));
    }
    PJRT_Executable* executable = compile.executable;
    TargetExecutable out;
    out.compile_time = RealClock().Now() - start;
    out.stats = pjrt::ReadExecutableStats(api_, executable);
    if (std::optional<pjrt::OptimizedProgram> optimized =
            pjrt::GetOptimizedProgram(api_, executable)) {
      out.optimized_hlo = std::move(optimized->code);
    }
    PJRT_ARGS(PJRT_Executable_Serialize_Args, serialize);
    serialize.executable = executable;
    status = PJRT_CALL(api_, PJRT_Executable_Serialize, serialize);
    if (status.ok()) {
      out.serialized.assign(serialize.serialized_bytes, serialize.serialized_bytes_size);
      serialize.serialized_executable_deleter(serialize.serialized_executable);
    }
    DestroyExecutable(api_, executable);
    RETURN_IF_ERROR(status);
    return out;
  }

 private:
  const Plugin* plugin_;
  const PJRT_Api* api_;
  const CompileTarget target_;
  PJRT_TopologyDescription* topology_;
  RuntimeIdentity identity_;
  std::vector<DeviceDescription> devices_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<TargetCompiler>> CreatePjrtTargetCompiler(
    const std::string& plugin_path, const CompileTarget& target) {
  ASSIGN_OR_RETURN(const Plugin* plugin, pjrt::LoadPlugin(plugin_path));
  const PJRT_Api* api = plugin->api;
  for (const bool has :
       {PJRT_HAS(api, PJRT_TopologyDescription_Create), PJRT_HAS(api, PJRT_Compile),
        PJRT_HAS(api, PJRT_Executable_Serialize),
        PJRT_HAS(api, PJRT_TopologyDescription_GetDeviceDescriptions)}) {
    if (!has) {
      return absl::UnimplementedError(absl::StrCat(
          "PJRT plugin ", plugin_path, " cannot compile for a topology (no ",
          "PJRT_TopologyDescription_Create/PJRT_Compile); compile on a host of the target"));
    }
  }
  // The options JAX's get_topology_desc and MaxText's train_compile pass libtpu.
  std::vector<PJRT_NamedValue> options;
  const std::string bounds_name = "chips_per_host_bounds";
  const std::string slices_name = "num_slices";
  const int64_t num_slices = target.num_slices;
  PJRT_ARGS(PJRT_NamedValue, bounds);
  bounds.name = bounds_name.c_str();
  bounds.name_size = bounds_name.size();
  bounds.type = PJRT_NamedValue_kInt64List;
  bounds.int64_array_value = target.chips_per_host_bounds.data();
  bounds.value_size = target.chips_per_host_bounds.size();
  options.push_back(bounds);
  if (num_slices > 1) {
    PJRT_ARGS(PJRT_NamedValue, slices);
    slices.name = slices_name.c_str();
    slices.name_size = slices_name.size();
    slices.type = PJRT_NamedValue_kInt64;
    slices.int64_value = num_slices;
    slices.value_size = 1;
    options.push_back(slices);
  }
  PJRT_ARGS(PJRT_TopologyDescription_Create_Args, create);
  create.topology_name = target.topology_name.c_str();
  create.topology_name_size = target.topology_name.size();
  create.create_options = options.data();
  create.num_options = options.size();
  absl::Status created = PJRT_CALL(api, PJRT_TopologyDescription_Create, create);
  if (!created.ok()) {
    return absl::Status(created.code(), absl::StrCat("topology ", target.topology_name, " for ",
                                                     target.name, ": ", created.message()));
  }
  auto compiler = std::make_unique<PjrtTargetCompiler>(plugin, target, create.topology);
  RETURN_IF_ERROR(compiler->Describe());
  return compiler;
}

namespace pjrt {

ExecutableStats ReadExecutableStats(const PJRT_Api* api, PJRT_Executable* executable) {
  ExecutableStats stats;
  std::vector<std::string> unreported;
  PJRT_ARGS(PJRT_Executable_GetCompiledMemoryStats_Args, memory);
  memory.executable = executable;
  if (!PJRT_HAS(api, PJRT_Executable_GetCompiledMemoryStats)) {
    unreported.push_back("memory (no PJRT_Executable_GetCompiledMemoryStats)");
  } else if (absl::Status s = PJRT_CALL(api, PJRT_Executable_GetCompiledMemoryStats, memory);
             !s.ok()) {
    unreported.push_back(absl::StrCat("memory (", s.message(), ")"));
  } else {
    stats.memory = CompiledMemory{.argument_bytes = memory.argument_size_in_bytes,
                                  .output_bytes = memory.output_size_in_bytes,
                                  .alias_bytes = memory.alias_size_in_bytes,
                                  .temp_bytes = memory.temp_size_in_bytes,
                                  .generated_code_bytes = memory.generated_code_size_in_bytes};
  }
  PJRT_ARGS(PJRT_Executable_GetCostAnalysis_Args, cost);
  cost.executable = executable;
  if (!PJRT_HAS(api, PJRT_Executable_GetCostAnalysis)) {
    unreported.push_back("FLOPs (no PJRT_Executable_GetCostAnalysis)");
  } else if (absl::Status s = PJRT_CALL(api, PJRT_Executable_GetCostAnalysis, cost); !s.ok()) {
    unreported.push_back(absl::StrCat("FLOPs (", s.message(), ")"));
  } else {
    for (size_t i = 0; i < cost.num_properties; ++i) {
      const PJRT_NamedValue& p = cost.properties[i];
      const absl::string_view name(p.name, p.name_size);
      double value = 0;
      if (p.type == PJRT_NamedValue_kFloat) {
        value = p.float_value;
      } else if (p.type == PJRT_NamedValue_kInt64) {
        value = static_cast<double>(p.int64_value);
      } else {
        continue;
      }
      if (name == "flops") stats.flops = value;
      if (name == "bytes accessed") stats.bytes_accessed = value;
    }
    if (!stats.flops) unreported.push_back("FLOPs (not in the plugin's cost analysis)");
  }
  PJRT_ARGS(PJRT_Executable_Fingerprint_Args, fingerprint);
  fingerprint.executable = executable;
  if (PJRT_HAS(api, PJRT_Executable_Fingerprint) &&
      PJRT_CALL(api, PJRT_Executable_Fingerprint, fingerprint).ok() &&
      fingerprint.executable_fingerprint != nullptr) {
    stats.fingerprint.assign(fingerprint.executable_fingerprint,
                             fingerprint.executable_fingerprint_size);
  }
  stats.unreported = absl::StrJoin(unreported, "; ");
  return stats;
}

}  // namespace pjrt
}  // namespace meshrun::runtime
