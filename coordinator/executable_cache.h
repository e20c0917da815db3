// The coordinator's compile-once persistent executable cache.
//
// Key: CacheKey() = sha256 over (program bytes, serialized compile options, device
// assignment, runtime identity), each length-prefixed, so no two different inputs collide by
// concatenation. A serialized executable is only valid for the identity that compiled it.
//
// On disk, one file per entry in `Config::directory`:
//   <key>.<sha256 of contents>.xexe   the serialized executable, byte for byte
//   .tmp.*                            entries being written (renamed into place when done)
//   .lock                             flock()ed by the one cache object using the directory
// Writes are atomic: a temp file in the same directory, fsync, rename, fsync of the
// directory. Every read re-hashes the contents against the checksum in the file name; a
// corrupt entry is deleted, logged with spdlog::warn, and reported as a miss so the caller
// recompiles. Recency lives in each file's mtime (set from the injected clock on insert and
// on every hit), so LRU order survives restarts; when the stored bytes exceed
// `max_bytes`, least recently used entries are deleted first (ties by key).
// Sizes are 64-bit throughout and I/O is streamed in 1 MiB pieces, so entries above 2 GiB work.
// The file plumbing (durable writes, hashing, reads) is common/durable_file.h's. The cache is
// not a ContentStore (common/content_store.h): its files are named by cache key and content
// sha256 together, and it hands out open handles that outlive eviction.
//
// Lifetime: Create() returns an owned cache holding the directory's lock until destroyed;
// the clock must outlive it. CachedExecutable handles stay readable after the cache object
// or the entry's file is gone (they hold an open descriptor).
// Thread-safety: every method of ExecutableCache is safe to call concurrently;
// CachedExecutable is an immutable value whose reads (pread) are safe from many threads.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "runtime/identity.h"

namespace meshrun::coordinator {

// Lowercase hex sha256 over the length-prefixed encoding of the inputs (a domain tag, then
// each byte string as u64-LE length + bytes, the device ids as u64-LE count + i64-LE each, the
// identity's strings length-prefixed and its API versions as u32-LE, then the compile target
// when one is given). `target` names the TPU slice an executable was compiled for without
// being on it ("v6e-8", runtime/compile_target.h); empty when compiled by the hosts' own
// runtime, and then the key is what it was before targets existed.
std::string CacheKey(absl::string_view program, absl::string_view compile_options,
                     absl::Span<const int32_t> device_assignment,
                     const runtime::RuntimeIdentity& runtime, absl::string_view target = "");

// A verified entry, open for reading. Cheap to copy (shares one descriptor).
class CachedExecutable {
 public:
  const std::string& key() const { return key_; }
  const std::string& sha256() const { return sha256_; }  // of the contents
  uint64_t size() const { return size_; }
  // Where the entry was stored; empty when it was not stored (larger than max_bytes). The
  // file may be evicted at any time: read through this handle, not the path.
  const std::string& path() const { return path_; }

  // Up to `max_bytes` bytes from `offset` (fewer only at the end).
  // Errors: OUT_OF_RANGE (offset > size), DATA_LOSS (read failed or the file shrank).
  absl::StatusOr<std::string> ReadAt(uint64_t offset, size_t max_bytes) const;
  // Exactly `out.size()` bytes from `offset` into a caller's buffer (a gRPC slice, say), so a
  // sender needs no copy of its own. Errors: OUT_OF_RANGE (past the end), DATA_LOSS.
  absl::Status ReadAt(uint64_t offset, absl::Span<char> out) const;
  // The whole contents. Errors: as ReadAt; RESOURCE_EXHAUSTED if it cannot fit in memory.
  absl::StatusOr<std::string> ReadAll() const;
  // Calls `sink` with consecutive pieces of at most `chunk_bytes` (> 0) covering the contents;
  // stops at the first error from `sink` and returns it. Errors: as ReadAt, INVALID_ARGUMENT.
  absl::Status ForEachChunk(size_t chunk_bytes,
                            const std::function<absl::Status(absl::string_view)>& sink) const;

 private:
  friend class ExecutableCache;
  struct File;
  CachedExecutable(std::string key, std::string sha256, uint64_t size, std::string path,
                   std::shared_ptr<const File> file);

  std::string key_;
  std::string sha256_;
  uint64_t size_ = 0;
  std::string path_;
  std::shared_ptr<const File> file_;
};

class ExecutableCache {
 public:
  struct Config {
    std::string directory;                      // created if missing
    uint64_t max_bytes = uint64_t{64} << 30;    // stored bytes kept at most (64 GiB)
    // Leftover temp files older than this (a crash mid-write) are deleted by Create().
    absl::Duration stale_temp_age = absl::Hours(1);
    Clock* clock = &RealClock();                // recency and compile timing
  };

  enum class Outcome {
    kHit,       // found on disk
    kCompiled,  // this call compiled it
    kJoined,    // a concurrent call for the same key compiled it; this one waited
  };
  static const char* OutcomeName(Outcome outcome);

  struct GetOrCompileResult {
    CachedExecutable executable;
    Outcome outcome = Outcome::kHit;
    absl::Duration compile_time;  // of the compile that produced it; zero on a hit
    bool stored = true;           // false: larger than max_bytes, kept only in this handle
  };

  struct EntryInfo {
    std::string key;
    std::string sha256;
    uint64_t size = 0;
    absl::Time last_used;
  };

  // Errors: INVALID_ARGUMENT (empty directory, null clock, max_bytes 0), FAILED_PRECONDITION
  // (another cache object holds the directory), PERMISSION_DENIED / INTERNAL (cannot create,
  // lock or list the directory; path named).
  static absl::StatusOr<std::unique_ptr<ExecutableCache>> Create(Config config);
  ~ExecutableCache();
  ExecutableCache(const ExecutableCache&) = delete;
  ExecutableCache& operator=(const ExecutableCache&) = delete;

  // The verified entry, or nullopt on a miss (absent, or corrupt: then deleted and warned).
  // A hit makes the entry the most recently used.
  // Errors: INVALID_ARGUMENT (key is not 64 lowercase hex), PERMISSION_DENIED / INTERNAL
  // (the file exists but cannot be opened).
  absl::StatusOr<std::optional<CachedExecutable>> Lookup(const std::string& key);

  // Stores `bytes` under `key` (replacing an older entry of the key), most recently used,
  // then evicts least recently used entries while over max_bytes.
  // Errors: INVALID_ARGUMENT (bad key), RESOURCE_EXHAUSTED (bytes exceed max_bytes: nothing
  // stored), INTERNAL / PERMISSION_DENIED (write, fsync or rename failed; no partial entry
  // is left behind).
  absl::Status Insert(const std::string& key, absl::string_view bytes);

  // Lookup, or on a miss `compile` and Insert, with each key compiled at most once at a time
  // in this process: concurrent callers for a key wait for the first and share its result,
  // including its error (the next call after a failure compiles again). An executable larger
  // than max_bytes is returned unstored (`stored` false, a warning logged).
  // Errors: those of Lookup and Insert, and whatever `compile` returns.
  absl::StatusOr<GetOrCompileResult> GetOrCompile(
      const std::string& key, const std::function<absl::StatusOr<std::string>()>& compile);

  uint64_t Size() const;          // stored bytes
  size_t EntryCount() const;
  std::vector<EntryInfo> List() const;  // most recently used first
  const Config& config() const { return config_; }

 private:
  struct Meta {
    std::string sha256;
    uint64_t size = 0;
    absl::Time last_used;
  };
  struct Flight;

  ExecutableCache(Config config, int lock_fd);
  absl::Status Load();
  std::string EntryPath(const std::string& key, const std::string& sha256) const;
  // Writes `bytes` to a new temp file: returns its descriptor (open read-write) and path.
  absl::StatusOr<std::pair<int, std::string>> WriteTemp(const std::string& key,
                                                        absl::string_view bytes,
                                                        absl::Time mtime);
  absl::StatusOr<CachedExecutable> InsertAndOpen(const std::string& key, absl::string_view bytes,
                                                 bool keep_unstored);
  // Deletes a corrupt entry if its file is still the one that was read (device, inode).
  void DropCorrupt(const std::string& key, const std::string& sha256, uint64_t device,
                   uint64_t inode, const std::string& why);
  void EvictLocked(const std::string& keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  const int lock_fd_;
  mutable absl::Mutex mu_;
  std::map<std::string, Meta> entries_ ABSL_GUARDED_BY(mu_);
  uint64_t total_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t temp_counter_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, std::shared_ptr<Flight>> flights_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun::coordinator
