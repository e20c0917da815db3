#include "common/durable_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/file_sync.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace meshrun {
namespace {

constexpr size_t kIoChunk = size_t{1} << 20;      // reads and hashing
constexpr size_t kWriteChunk = size_t{64} << 20;  // below Linux's 0x7ffff000 per write()

}  // namespace

absl::Status ErrnoStatus(int error, absl::string_view what) {
  std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT: return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
    case EROFS: return absl::PermissionDeniedError(message);
    case ENOSPC:
    case EDQUOT: return absl::ResourceExhaustedError(message);
    default: return absl::InternalError(message);
  }
}

bool IsSha256Hex(absl::string_view s) {
  return s.size() == 64 && std::all_of(s.begin(), s.end(), [](char c) {
           return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
         });
}

absl::Status PreadFull(int fd, char* out, size_t n, uint64_t offset) {
  size_t done = 0;
  while (done < n) {
    const ssize_t got = ::pread(fd, out + done, n - done, static_cast<off_t>(offset + done));
    if (got < 0) {
      if (errno == EINTR) continue;
      return absl::DataLossError(absl::StrCat("read failed at byte ", offset + done, ": ",
                                              std::strerror(errno)));
    }
    if (got == 0) {
      return absl::DataLossError(
          absl::StrCat("file ended at byte ", offset + done, ", expected ", offset + n));
    }
    done += static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Sha256OfFd(int fd, uint64_t size) {
  Sha256 hasher;
  std::string buffer(static_cast<size_t>(std::min<uint64_t>(kIoChunk, size)), '\0');
  for (uint64_t offset = 0; offset < size;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kIoChunk, size - offset));
    RETURN_IF_ERROR(PreadFull(fd, buffer.data(), n, offset));
    hasher.Update(absl::string_view(buffer.data(), n));
    offset += n;
  }
  return hasher.HexDigest();
}

absl::Status SetMtime(int fd, absl::Time mtime, const std::string& path) {
  struct timespec times[2];
  times[0].tv_sec = 0;
  times[0].tv_nsec = UTIME_OMIT;
  times[1] = absl::ToTimespec(mtime);
  if (::futimens(fd, times) != 0) return ErrnoStatus(errno, absl::StrCat("futimens ", path));
  return absl::OkStatus();
}

absl::StatusOr<int> WriteDurableFile(const std::string& path, absl::string_view bytes,
                                     std::optional<absl::Time> mtime) {
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot create ", path));
  auto fail = [&](const absl::Status& status) -> absl::StatusOr<int> {
    ::close(fd);
    ::unlink(path.c_str());
    return status;
  };
  for (size_t done = 0; done < bytes.size();) {
    const size_t n = std::min(kWriteChunk, bytes.size() - done);
    const ssize_t wrote = ::write(fd, bytes.data() + done, n);
    if (wrote < 0) {
      if (errno == EINTR) continue;
      return fail(ErrnoStatus(errno, absl::StrCat("write ", path, " at byte ", done)));
    }
    done += static_cast<size_t>(wrote);
  }
  // The time first, so the fsync below carries it to disk with the data.
  if (mtime.has_value()) {
    if (absl::Status status = SetMtime(fd, *mtime, path); !status.ok()) return fail(status);
  }
  if (const int error = FsyncInPieces(fd); error != 0) {
    return fail(ErrnoStatus(error, absl::StrCat("fsync ", path)));
  }
  return fd;
}

int FsyncFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno;
  const int error = FsyncInPieces(fd);
  ::close(fd);
  return error;
}

}  // namespace meshrun
