// The file plumbing of the on-disk stores: writing a file that survives a crash (temp file,
// fsync, rename, fsync of the directory) and reading one back checked against its sha256.
// ContentStore (common/content_store.h) is built on it, and so is the coordinator's compile
// cache, whose file names are not content addresses (coordinator/executable_cache.h).
// Sizes and offsets are 64-bit, and writes go in pieces below Linux's 2 GiB per write(), so
// files past 4 GiB work.
//
// Thread-safety: every function is safe to call concurrently; they share no state.
// Errors: from errno through ErrnoStatus (NOT_FOUND, PERMISSION_DENIED, RESOURCE_EXHAUSTED for
// a full disk, INTERNAL otherwise), with the path named; DATA_LOSS for short reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace meshrun {

// `what: strerror(error)` with the code that fits the errno: ENOENT NOT_FOUND; EACCES, EPERM,
// EROFS PERMISSION_DENIED; ENOSPC, EDQUOT RESOURCE_EXHAUSTED; anything else INTERNAL.
absl::Status ErrnoStatus(int error, absl::string_view what);

// Whether `s` is 64 lowercase hex digits, the form of every sha256 the stores name files by.
bool IsSha256Hex(absl::string_view s);

// Reads exactly `n` bytes at `offset` into `out`, across as many pread calls as it takes.
// Errors: DATA_LOSS (a read failed, or the file ended first).
absl::Status PreadFull(int fd, char* out, size_t n, uint64_t offset);

// The sha256 of the first `size` bytes of `fd`, read in 1 MiB pieces. Errors: as PreadFull.
absl::StatusOr<std::string> Sha256OfFd(int fd, uint64_t size);

// Sets the modification time of `fd` (the stores keep recency in it, so LRU order survives a
// restart). `path` only names the file in the error.
absl::Status SetMtime(int fd, absl::Time mtime, const std::string& path);

// Creates `path` (which must not exist), writes `bytes`, sets its modification time to `mtime`
// when given, and fsyncs it (common/file_sync.h). Returns the descriptor, open read-write, for
// the caller to close; it is not renamed anywhere. On failure nothing is left at `path`.
// Errors: ErrnoStatus of the create (an existing `path` is INTERNAL), write, futimens or fsync.
absl::StatusOr<int> WriteDurableFile(const std::string& path, absl::string_view bytes,
                                     std::optional<absl::Time> mtime);

// Opens the file at `path` and fsyncs it in pieces (common/file_sync.h), for a file that was
// written through another descriptor. Returns 0, or the errno of the failing open or fsync.
int FsyncFile(const std::string& path);

}  // namespace meshrun
