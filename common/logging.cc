#include "common/logging.h"

#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace meshrun {
namespace {

// %* in a pattern: the message as the inside of a JSON string.
class JsonMessage final : public spdlog::custom_flag_formatter {
 public:
  void format(const spdlog::details::log_msg& msg, const std::tm&,
              spdlog::memory_buf_t& dest) override {
    for (char c : std::string_view(msg.payload.data(), msg.payload.size())) {
      switch (c) {
        case '"': Append("\\\"", dest); break;
        case '\\': Append("\\\\", dest); break;
        case '\n': Append("\\n", dest); break;
        case '\r': Append("\\r", dest); break;
        case '\t': Append("\\t", dest); break;
        default:
          if (static_cast<unsigned char>(c) < 0x20) {
            Append(absl::StrFormat("\\u%04x", c), dest);
          } else {
            dest.push_back(c);
          }
      }
    }
  }
  std::unique_ptr<custom_flag_formatter> clone() const override {
    return std::make_unique<JsonMessage>();
  }

 private:
  static void Append(std::string_view text, spdlog::memory_buf_t& dest) {
    dest.append(text.data(), text.data() + text.size());
  }
};

}  // namespace

absl::Status InitLogging(const std::string& program, const std::string& level,
                         const std::string& format) {
  const spdlog::level::level_enum parsed = spdlog::level::from_str(level);
  // from_str answers "off" for anything it does not know; only accept "off" when asked.
  if (parsed == spdlog::level::off && level != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--log_level=", level, " is not a level; use trace, debug, info, warn, error or off"));
  }
  if (format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format=", format, " is not text or json"));
  }
  auto logger = spdlog::stderr_color_mt(program);
  // Timestamps in UTC (the trailing Z says so), whatever the host's time zone.
  if (format == "json") {
    auto formatter = std::make_unique<spdlog::pattern_formatter>(spdlog::pattern_time_type::utc);
    formatter->add_flag<JsonMessage>('*').set_pattern(
        "{\"time\":\"%Y-%m-%dT%H:%M:%S.%fZ\",\"level\":\"%l\",\"program\":\"%n\","
        "\"thread\":%t,\"message\":\"%*\"}");
    logger->set_formatter(std::move(formatter));
  } else {
    logger->set_pattern("%Y-%m-%dT%H:%M:%S.%eZ %^%L%$ %n] %v", spdlog::pattern_time_type::utc);
  }
  logger->set_level(parsed);
  spdlog::set_default_logger(logger);
  return absl::OkStatus();
}

}  // namespace meshrun
