#include "rpc/server_support.h"

#include <gtest/gtest.h>

#include <fstream>

namespace meshrun::services {
namespace {

TEST(ParseHostPortTest, AcceptsCommonForms) {
  EXPECT_EQ(ParseHostPort("listen", "127.0.0.1:7070")->port, 7070);
  EXPECT_EQ(ParseHostPort("listen", "[::]:0")->host, "::");
  EXPECT_EQ(ParseHostPort("listen", "node-3:7071")->host, "node-3");
}

TEST(ParseHostPortTest, RefusalsNameTheFlagAndTheForm) {
  for (const char* bad : {"7070", ":7070", "host:", "host:70000", "host:x", "::1:7070", "[::1:7"}) {
    absl::StatusOr<HostPort> parsed = ParseHostPort("listen", bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(parsed.status().message().find("--listen="), absl::string_view::npos);
    EXPECT_NE(parsed.status().message().find("HOST:PORT"), absl::string_view::npos);
  }
}

TEST(PrepareStateDirTest, CreatesNestedDirectories) {
  const std::string dir = ::testing::TempDir() + "/state_test/a/b";
  EXPECT_TRUE(PrepareStateDir("state_dir", dir).ok());
}

TEST(PrepareStateDirTest, AFileInTheWayIsAClearError) {
  const std::string file = ::testing::TempDir() + "/state_test_file";
  std::ofstream(file) << "x";
  absl::Status status = PrepareStateDir("state_dir", file + "/sub");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("--state_dir=" + file + "/sub"), absl::string_view::npos);
}

TEST(StartGrpcServerTest, PortInUseIsRefusedNotShared) {
  auto first = StartGrpcServer("listen", "127.0.0.1:0", {});
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string taken = "127.0.0.1:" + std::to_string(first->port);
  auto second = StartGrpcServer("listen", taken, {});
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(second.status().message().find(taken), absl::string_view::npos);
  DrainServer(*first->server, absl::ZeroDuration());
}

}  // namespace
}  // namespace meshrun::services
