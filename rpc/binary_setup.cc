#include "rpc/binary_setup.h"
#include "rpc/security_flags.h"

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "common/mutex_checks.h"
#include "rpc/server_support.h"

ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error or off");
ABSL_FLAG(std::string, log_format, "text",
          "text, or json (one object a line: time, level, program, thread, message) for log "
          "pipelines; timestamps are UTC either way");

namespace meshrun::services {
namespace {
std::string program_name = "meshrun";
std::vector<std::string> command_line;  // argv as given, for RepeatedFlagValues

// The folders whose flags --help lists: meshrun's binaries and the RPC support they share,
// not abseil's or gRPC's.
constexpr absl::string_view kFlagFolders[] = {"rpc/", "cli/", "coordinator_service/",
                                              "worker_service/"};

// Where one of kFlagFolders starts in `file` as a whole path component; npos if none does.
size_t FlagFolderAt(absl::string_view file) {
  for (absl::string_view folder : kFlagFolders) {
    const size_t at = file.rfind(folder);
    if (at != absl::string_view::npos && (at == 0 || file[at - 1] == '/')) return at;
  }
  return absl::string_view::npos;
}

bool IsMeshrunFlagFile(absl::string_view file) {
  return FlagFolderAt(file) != absl::string_view::npos;
}
}  // namespace

void ExitWithError(const std::string& message, int code) {
  std::fprintf(stderr, "%s: error: %s\n", program_name.c_str(), message.c_str());
  std::exit(code);
}

std::vector<std::string> InitBinary(const char* program, const char* usage, int argc,
                                    char** argv) {
  program_name = program;
  command_line.assign(argv, argv + argc);
  if (std::string(program) != "meshrun") {
    // Before any thread: umask is per process. Never looser than 0077, stricter if the caller's is.
    const mode_t inherited = umask(0077);
    umask(inherited | 0077);
  }
  ConfigureMutexDeadlockDetection();
  BlockTerminationSignals();
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = IsMeshrunFlagFile;
  config.contains_help_flags = IsMeshrunFlagFile;
  config.normalize_filename = [](absl::string_view file) {
    const size_t at = FlagFolderAt(file);
    return std::string(at == absl::string_view::npos ? file : file.substr(at));
  };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  std::vector<char*> positional = absl::ParseCommandLine(argc, argv);
  if (absl::Status status = InitLogging(program, absl::GetFlag(FLAGS_log_level),
                                              absl::GetFlag(FLAGS_log_format));
      !status.ok()) {
    ExitWithError(std::string(status.message()), 2);
  }
  RouteGrpcLogsToSpdlog();
  if (absl::Status status = ApplySecurityFlags(std::string(program) != "meshrun"); !status.ok()) {
    ExitWithError(std::string(status.message()), 2);
  }
  return std::vector<std::string>(positional.begin(), positional.end());
}

std::string RepeatedFlagValues(const std::string& name, const std::string& parsed) {
  std::vector<std::string> values;
  for (size_t i = 1; i < command_line.size(); ++i) {
    absl::string_view arg = command_line[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "--")) {
      if (!absl::ConsumePrefix(&arg, "-")) continue;
    }
    if (!absl::ConsumePrefix(&arg, name)) continue;
    if (absl::ConsumePrefix(&arg, "=")) {
      values.emplace_back(arg);
    } else if (arg.empty() && i + 1 < command_line.size()) {
      values.push_back(command_line[++i]);
    }
  }
  return values.size() > 1 ? absl::StrJoin(values, ",") : parsed;
}

}  // namespace meshrun::services
