#include "cli/cli_compile.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <google/protobuf/struct.pb.h>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "bundle/example_job.h"
#include "cli/cli_common.h"
#include "rpc/binary_setup.h"
#include "runtime/compile_options.h"
#include "runtime/compile_target.h"
#include "runtime/backends.h"
#include "runtime/runtime_setup.h"
#include "runtime/target_compiler.h"

ABSL_FLAG(std::string, target, "v6e-8",
          "compile: the TPU slice to compile for (v6e-8, v6e-16, 2xv6e-8, v5e-4, ...)");
ABSL_FLAG(std::string, compiler_plugin, "",
          "compile: libtpu.so to compile with; default $TPU_LIBRARY_PATH, else the libtpu "
          "set-up fetched");
ABSL_FLAG(std::string, hlo_out, "",
          "compile: directory to write each program's optimized HLO module (<role>.hlo.pb) and the "
          "compile options used (compile_options.pb)");

namespace meshrun::services {
namespace {

std::string CompilerPlugin() {
  if (std::string flag = absl::GetFlag(FLAGS_compiler_plugin); !flag.empty()) return flag;
  if (const char* env = std::getenv("TPU_LIBRARY_PATH"); env != nullptr && *env != '\0') {
    return env;
  }
  return runtime::DefaultTpuCompilerPluginPath();
}

struct Row {
  std::string role;
  const runtime::ExampleProgram* program;
};

}  // namespace

int RunCompileCommand(const std::vector<std::string>& args) {
  if (args.size() != 3) {
    ExitWithError("usage: meshrun compile <bundle directory or job.json> --target=v6e-8", 2);
  }
  absl::StatusOr<runtime::CompileTarget> target =
      runtime::ParseCompileTarget(absl::GetFlag(FLAGS_target));
  if (!target.ok()) ExitWithError(absl::StrCat("--target: ", target.status().message()), 2);
  std::string job_json = args[2];
  if (std::filesystem::is_directory(job_json)) job_json += "/job.json";
  absl::StatusOr<runtime::ExampleJob> job = runtime::LoadExampleJob(job_json);
  if (!job.ok()) ExitWithError(std::string(job.status().message()), 2);
  const int devices = static_cast<int>(job->device_ids.size());
  if (devices > target->devices()) {
    ExitWithError(absl::StrCat("the job's mesh has ", devices, " devices; ", target->name,
                               " has ", target->devices(),
                               ": export the job for this target's device count"), 2);
  }
  const std::string plugin = CompilerPlugin();
  absl::StatusOr<std::unique_ptr<runtime::TargetCompiler>> compiler =
      CreateTargetCompiler(plugin, *target);
  if (!compiler.ok()) {
    ExitWithError(absl::StrCat("cannot compile for ", target->name, " with ", plugin, ": ",
                               compiler.status().message()), 1);
  }
  const bool json = JsonOutput();
  google::protobuf::Struct report;
  auto& fields = *report.mutable_fields();
  fields["target"].set_string_value(target->name);
  fields["topology"].set_string_value(target->topology_name);
  fields["devices"].set_number_value(target->devices());
  fields["device_kind"].set_string_value(target->chip.device_kind);
  fields["hbm_bytes_per_device"].set_number_value(static_cast<double>(target->chip.hbm_bytes));
  fields["peak_bf16_flops_per_device"].set_number_value(target->chip.peak_bf16_flops);
  fields["compiler"].set_string_value(runtime::ToString((*compiler)->identity()));
  fields["job_devices"].set_number_value(devices);
  google::protobuf::ListValue& programs = *fields["programs"].mutable_list_value();
  if (!json) std::printf("target %s: topology %s, %d x %s (%s HBM, %.0f TFLOP/s bf16 each), %d host(s); "
              "compiler %s\n",
              target->name.c_str(), target->topology_name.c_str(), target->devices(),
              target->chip.device_kind.c_str(), runtime::FormatBytes(target->chip.hbm_bytes).c_str(),
              target->chip.peak_bf16_flops / 1e12, target->hosts(),
              runtime::ToString((*compiler)->identity()).c_str());
  if (devices < target->devices() && !json) {
    std::printf("note: the job's mesh uses %d of the target's %d devices\n", devices,
                target->devices());
  }
  // The topology's global ids (multislice: slice s counts from (s+1)*100000), an equal share
  // from each slice, in id order. The coordinator orders a slice's chips along its ICI rings
  // (coordinator/mesh_planner.h), which changes neither fit nor FLOPs.
  std::map<int32_t, std::vector<int64_t>> by_slice;  // process-independent: id / 100000
  for (const runtime::DeviceDescription& d : (*compiler)->devices()) {
    by_slice[d.global_id / 100000].push_back(d.global_id);
  }
  const int per_slice = devices % target->num_slices == 0 ? devices / target->num_slices : devices;
  std::vector<int64_t> device_ids;
  for (auto& [slice, ids] : by_slice) {
    std::sort(ids.begin(), ids.end());
    for (int i = 0; i < per_slice && static_cast<int>(device_ids.size()) < devices; ++i) {
      device_ids.push_back(ids[i]);
    }
  }
  absl::StatusOr<std::string> options =
      runtime::BuildCompileOptions(runtime::SpmdCompileOptions(device_ids));
  if (!options.ok()) ExitWithError(std::string(options.status().message()), 1);
  std::vector<Row> rows = {{"init", &job->init}};
  if (job->mode_b()) {
    rows.push_back({"grad", &job->grad});
    rows.push_back({"apply", &job->apply});
  } else {
    rows.push_back({"step", &job->step});
  }
  const std::string hlo_out = absl::GetFlag(FLAGS_hlo_out);
  if (!hlo_out.empty()) {
    std::filesystem::create_directories(hlo_out);
    std::ofstream(hlo_out + "/compile_options.pb", std::ios::binary) << *options;
  }
  if (!json) std::printf("%-6s %12s %12s %12s %12s %10s %14s %12s %9s\n", "program", "per device",
              "arguments", "outputs", "temporaries", "code", "FLOPs/device", "executable",
              "compile");
  int exit_code = 0;
  std::vector<std::string> refusals;
  for (const Row& row : rows) {
    absl::StatusOr<runtime::TargetExecutable> compiled = (*compiler)->Compile(
        {.code = row.program->code, .format = "mlir", .compile_options = *options});
    if (!compiled.ok()) {
      const std::string message(compiled.status().message());
      if (absl::IsResourceExhausted(compiled.status())) {
        refusals.push_back(absl::StrCat("program ", row.role, " ", message));
      } else {
        std::fprintf(stderr, "meshrun: program %s: %s\n", row.role.c_str(), message.c_str());
      }
      exit_code = 1;
      continue;
    }
    const runtime::ExecutableStats& stats = compiled->stats;
    const runtime::CompiledMemory memory = stats.memory.value_or(runtime::CompiledMemory{});
    auto& program = *programs.add_values()->mutable_struct_value()->mutable_fields();
    program["program"].set_string_value(row.role);
    for (const auto& [name, bytes] : std::map<std::string, int64_t>{
             {"device_bytes", memory.DeviceBytes()}, {"argument_bytes", memory.argument_bytes},
             {"output_bytes", memory.output_bytes}, {"alias_bytes", memory.alias_bytes},
             {"temp_bytes", memory.temp_bytes}, {"code_bytes", memory.generated_code_bytes},
             {"executable_bytes", static_cast<int64_t>(compiled->serialized.size())}}) {
      program[name].set_number_value(static_cast<double>(bytes));
    }
    if (stats.flops) program["flops_per_device"].set_number_value(*stats.flops);
    program["compile_seconds"].set_number_value(absl::ToDoubleSeconds(compiled->compile_time));
    if (!stats.unreported.empty()) program["unreported"].set_string_value(stats.unreported);
    if (!json) std::printf("%-6s %12s %12s %12s %12s %10s %14s %12s %8.2fs\n", row.role.c_str(),
                runtime::FormatBytes(memory.DeviceBytes()).c_str(),
                runtime::FormatBytes(memory.argument_bytes).c_str(),
                runtime::FormatBytes(memory.output_bytes).c_str(),
                runtime::FormatBytes(memory.temp_bytes).c_str(),
                runtime::FormatBytes(memory.generated_code_bytes).c_str(),
                stats.flops ? absl::StrFormat("%.4g", *stats.flops).c_str() : "-",
                runtime::FormatBytes(static_cast<int64_t>(compiled->serialized.size())).c_str(),
                absl::ToDoubleSeconds(compiled->compile_time));
    if (!stats.unreported.empty() && !json) std::printf("       not reported: %s\n", stats.unreported.c_str());
    if (stats.memory) {
      if (absl::Status fits = runtime::CheckFits(row.role, *stats.memory, target->chip);
          !fits.ok()) {
        refusals.emplace_back(fits.message());
        exit_code = 1;
      }
    }
    if (!hlo_out.empty() && !compiled->optimized_hlo.empty()) {
      std::ofstream(hlo_out + "/" + row.role + ".hlo.pb", std::ios::binary)
          << compiled->optimized_hlo;
    }
  }
  for (const std::string& refusal : refusals) {
    std::fprintf(stderr, "meshrun: does not fit %s: %s\n", target->name.c_str(), refusal.c_str());
    fields["refusals"].mutable_list_value()->add_values()->set_string_value(refusal);
  }
  fields["fits"].set_bool_value(exit_code == 0);
  if (json) {
    PrintJson(report);
  } else if (exit_code == 0) {
    std::printf("fits %s\n", target->name.c_str());
  }
  return exit_code;
}

}  // namespace meshrun::services
