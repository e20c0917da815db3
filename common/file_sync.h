// fsync for files that may be gigabytes. One fsync of a large file makes every other fsync on
// the filesystem wait until all of it is on disk (ext4's ordered journal commits it first),
// stalling whoever else shares the disk: a coordinator's telemetry history, a worker's logs.
// Writing the data back in pieces first keeps each of those waits short.
//
// Thread-safety: safe from any thread; blocks for the disk.
#pragma once

#include <string>

namespace meshrun {

// Writes `fd`'s data back in 32 MiB pieces, waiting for each, then fsyncs it (what is left,
// the metadata, and any write error). Returns 0, or the errno of the failing fsync.
int FsyncInPieces(int fd);

// fsyncs the directory at `path`, so renames and creations in it survive a crash. Returns 0,
// or the errno of the failing open or fsync.
int FsyncDirectory(const std::string& path);

}  // namespace meshrun
