#include "services/binary_setup.h"
#include "services/security_flags.h"

#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "common/logging.h"
#include "services/server_support.h"

ABSL_FLAG(std::string, log_level, "info", "trace, debug, info, warn, error or off");
ABSL_FLAG(std::string, log_format, "text",
          "text, or json (one object a line: time, level, program, thread, message) for log "
          "pipelines; timestamps are UTC either way");

namespace meshrun::services {
namespace {
std::string program_name = "meshrun";

bool IsMeshrunFlagFile(absl::string_view file) { return absl::StrContains(file, "services/"); }
}  // namespace

void ExitWithError(const std::string& message, int code) {
  std::fprintf(stderr, "%s: error: %s\n", program_name.c_str(), message.c_str());
  std::exit(code);
}

std::vector<std::string> InitBinary(const char* program, const char* usage, int argc,
                                    char** argv) {
  program_name = program;
  BlockTerminationSignals();
  absl::FlagsUsageConfig config;
  config.contains_helpshort_flags = IsMeshrunFlagFile;
  config.contains_help_flags = IsMeshrunFlagFile;
  config.normalize_filename = [](absl::string_view file) {
    const size_t at = file.find("services/");
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

}  // namespace meshrun::services
