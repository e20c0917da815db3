#include "rpc/server_support.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
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

mode_t ModeOf(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

TEST(PrepareStateDirTest, ANewDirectoryIsPrivateWhateverTheUmask) {
  const std::string dir = ::testing::TempDir() + "/state_test_private/new";
  std::filesystem::remove_all(::testing::TempDir() + "/state_test_private");
  const mode_t old_umask = umask(0022);
  EXPECT_TRUE(PrepareStateDir("state_dir", dir).ok());
  umask(old_umask);
  EXPECT_EQ(ModeOf(dir), 0700u);
}

// An older meshrun left a state directory 0755 with files 0644: it and everything under it
// become owner-only; a symbolic link inside is not followed.
TEST(PrepareStateDirTest, AnOpenDirectoryAndItsContentsAreNarrowed) {
  const std::string root = ::testing::TempDir() + "/state_test_open";
  std::filesystem::remove_all(root);
  const std::string outside = root + "/outside.txt";
  const std::string dir = root + "/state";
  std::filesystem::create_directories(dir + "/executables");
  std::ofstream(dir + "/telemetry.db") << "x";
  std::ofstream(dir + "/executables/abc") << "x";
  std::ofstream(outside) << "x";
  chmod(dir.c_str(), 0755);
  chmod((dir + "/executables").c_str(), 0775);
  chmod((dir + "/telemetry.db").c_str(), 0644);
  chmod((dir + "/executables/abc").c_str(), 0604);
  chmod(outside.c_str(), 0644);
  std::filesystem::create_symlink(outside, dir + "/link");
  ASSERT_TRUE(PrepareStateDir("state_dir", dir).ok());
  EXPECT_EQ(ModeOf(dir), 0700u);
  EXPECT_EQ(ModeOf(dir + "/executables"), 0700u);
  EXPECT_EQ(ModeOf(dir + "/telemetry.db"), 0600u);
  EXPECT_EQ(ModeOf(dir + "/executables/abc"), 0600u);
  EXPECT_EQ(ModeOf(outside), 0644u);  // the link's target, outside the state directory
}

// Already private: its contents are not walked (a 0644 file in a 0700 directory is unreachable).
TEST(PrepareStateDirTest, APrivateDirectoryIsLeftAsItIs) {
  const std::string dir = ::testing::TempDir() + "/state_test_kept";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/file") << "x";
  chmod((dir + "/file").c_str(), 0644);
  chmod(dir.c_str(), 0700);
  ASSERT_TRUE(PrepareStateDir("state_dir", dir).ok());
  EXPECT_EQ(ModeOf(dir + "/file"), 0644u);
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
