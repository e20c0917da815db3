#include "common/logging.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "absl/strings/str_cat.h"

namespace meshrun {

absl::Status InitLogging(const std::string& program, const std::string& level) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  // from_str answers "off" for anything it does not know; only accept "off" when asked.
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log_level=", level, " is not a level; use trace, debug, info, warn, error or off"));
  }
  auto logger = spdlog::stderr_color_mt(program);
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%L%$ %n] %v");
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace meshrun
