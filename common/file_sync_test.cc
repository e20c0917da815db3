#include "common/file_sync.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cerrno>
#include <string>

namespace meshrun {
namespace {

TEST(FsyncInPiecesTest, SyncsAFileOfSeveralPiecesAndReportsErrors) {
  const std::string path = ::testing::TempDir() + "/file_sync_test.bin";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  ASSERT_GE(fd, 0);
  const std::string block(1 << 20, 'x');
  for (int i = 0; i < 70; ++i) {  // three pieces, the last one partial
    ASSERT_EQ(::write(fd, block.data(), block.size()), static_cast<ssize_t>(block.size()));
  }
  EXPECT_EQ(FsyncInPieces(fd), 0);
  EXPECT_EQ(::lseek(fd, 0, SEEK_END), 70 << 20);
  ::close(fd);
  ::unlink(path.c_str());
  EXPECT_EQ(FsyncInPieces(fd), EBADF);  // closed: the fsync's error comes back
}

}  // namespace
}  // namespace meshrun
