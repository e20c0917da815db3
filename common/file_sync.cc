#include "common/file_sync.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

namespace meshrun {

int FsyncInPieces(int fd) {
  constexpr off_t kPiece = 32 << 20;
  const off_t size = ::lseek(fd, 0, SEEK_END);
  for (off_t offset = 0; offset < size; offset += kPiece) {
    // Failures show up again in the fsync below.
    ::sync_file_range(fd, offset, kPiece,
                      SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE |
                          SYNC_FILE_RANGE_WAIT_AFTER);
  }
  return ::fsync(fd) == 0 ? 0 : errno;
}

int FsyncDirectory(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int error = ::fsync(fd) == 0 ? 0 : errno;
  ::close(fd);
  return error;
}

}  // namespace meshrun
