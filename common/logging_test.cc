#include "common/logging.h"

#include <gtest/gtest.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

namespace meshrun {
namespace {

// Runs `log` with stderr sent to a file; returns what it wrote.
template <typename F>
std::string CaptureStderr(F log) {
  char path[] = "/tmp/logging_test_XXXXXX";
  const int fd = mkstemp(path);
  const int saved = dup(2);
  fflush(stderr);
  dup2(fd, 2);
  log();
  spdlog::default_logger()->flush();
  fflush(stderr);
  dup2(saved, 2);
  close(saved);
  close(fd);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  unlink(path);
  return text.str();
}

TEST(Logging, TextLinesCarryUtcTimestamps) {
  ASSERT_TRUE(InitLogging("text-test", "info").ok());
  const std::string line = CaptureStderr([] { spdlog::info("hello"); });
  EXPECT_TRUE(std::regex_search(
      line, std::regex(R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z .*I.* text-test\] hello\n$)")))
      << line;
}

TEST(Logging, JsonLinesAreOneEscapedObjectEach) {
  ASSERT_TRUE(InitLogging("json-test", "info", "json").ok());
  const std::string line =
      CaptureStderr([] { spdlog::warn("a \"quoted\" \\ path\nsecond line\x01"); });
  EXPECT_TRUE(std::regex_match(
      line, std::regex(R"(\{"time":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z","level":"warning",)"
                       R"("program":"json-test","thread":\d+,)"
                       R"("message":"a \\"quoted\\" \\\\ path\\nsecond line\\u0001"\}\n)")))
      << line;
}

TEST(Logging, UnknownFormatIsRefusedByName) {
  absl::Status status = InitLogging("bad-format", "info", "xml");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("--log_format=xml"), std::string::npos);
}

}  // namespace
}  // namespace meshrun
