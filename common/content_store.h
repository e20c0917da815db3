// A directory of files named by the sha256 of their contents, with a byte cap.
//
// On disk, in `Config::directory`:
//   <sha256><suffix>              an entry, byte for byte; its mtime is when it was last used
//   <sha256>.partial.<pid>.<n>    a temp file (Put's, or one a caller fills for Install)
// Nothing else is written there; files of other names are left alone. An entry appears only
// complete and durable: written to a temp file, fsynced, renamed into place, and the
// directory fsynced. Every Read re-hashes the contents; an entry that no longer matches its
// name is deleted. Past `max_bytes` the least recently used entries are deleted (one used
// within `keep_recent` is kept, so the total may stay over until it ages). Recency is the
// injected clock's time, kept in each file's mtime (set on Put, Install and every Read), so
// LRU order survives a restart.
//
// Create() takes stock of the directory: temp files left by a crash are deleted (or, with
// `recover_temp_files`, installed when they hash to the sha256 their name starts with: the
// caller had verified and committed them before the crash caught their flush), entries are
// indexed by name, size and mtime, and the cap is applied. The index is what Has, List and
// bytes answer from; files deleted behind the store's back show up as NOT_FOUND on Read.
//
// Users: the coordinator's program store (coordinator/program_store.h) and the worker's
// executable store (worker/executable_store.h), which fills temp files from chunked uploads.
//
// Lifetime: Create() returns an owned store; the clock must outlive it. Two stores must not
// share a directory (nothing enforces it).
// Thread-safety: every method is safe to call concurrently. Reads and writes of file contents
// run outside the store's lock; renames and deletions run under it, so the index and the
// directory agree.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace meshrun {

class ContentStore {
 public:
  struct Config {
    std::string directory;  // created when missing
    std::string suffix;     // of entry names, e.g. ".xexe"; must not contain ".partial"
    int64_t max_bytes = int64_t{16} << 30;
    absl::Duration keep_recent = absl::ZeroDuration();
    bool recover_temp_files = false;
    std::string log_name = "content store";  // how log lines name the store
    Clock* clock = &RealClock();
  };

  // Errors: INVALID_ARGUMENT (empty directory or suffix, a suffix containing ".partial", null
  // clock), FAILED_PRECONDITION (the directory cannot be created, or the directory cannot be
  // fsynced after recovering temp files; path named).
  static absl::StatusOr<std::unique_ptr<ContentStore>> Create(Config config);
  ContentStore(const ContentStore&) = delete;
  ContentStore& operator=(const ContentStore&) = delete;

  // Stores `bytes` under their sha256, durable when this returns, then applies the cap (never
  // to this entry: it was just used). Bytes already held are not written again; their entry
  // becomes the most recently used. Returns the sha256.
  // Errors: PERMISSION_DENIED / RESOURCE_EXHAUSTED / INTERNAL (create, write, fsync or rename
  // failed; path named; nothing is left behind).
  absl::StatusOr<std::string> Put(absl::string_view bytes);

  // A new temp file name in the directory for bytes of `sha256` that the caller writes itself
  // (Create treats it as a temp file), then hands to Install or deletes.
  std::string TempPath(const std::string& sha256);
  // Makes the file at `temp_path` (from TempPath, complete, its contents checked by the caller)
  // the entry of `sha256`: fsync, rename, fsync of the directory, then the cap. Replaces an
  // entry already held (same contents). The temp file is gone afterwards either way.
  // Errors: INVALID_ARGUMENT (`sha256` not 64 lowercase hex), NOT_FOUND (no file at
  // `temp_path`), PERMISSION_DENIED / INTERNAL (fsync or rename failed; path named).
  absl::Status Install(const std::string& sha256, const std::string& temp_path);

  // The contents of entry `sha256`, checked against it; the entry becomes the most recently
  // used. Errors: INVALID_ARGUMENT (not 64 lowercase hex), NOT_FOUND (not held),
  // PERMISSION_DENIED / INTERNAL (cannot open; path named), DATA_LOSS (the contents no longer
  // match, or cannot be read: the entry is deleted), RESOURCE_EXHAUSTED (too big for memory).
  absl::StatusOr<std::string> Read(const std::string& sha256);

  bool Has(const std::string& sha256) const;
  // Deletes entry `sha256`; whether it was held.
  bool Remove(const std::string& sha256);
  std::vector<std::string> List() const;  // the sha256 of every entry, sorted
  int64_t bytes() const;                  // of all entries: what the cap counts
  std::string PathOf(const std::string& sha256) const;
  const Config& config() const { return config_; }

 private:
  struct Use {  // the shape common/lru.h expects
    int64_t bytes = 0;
    absl::Time last;
  };

  explicit ContentStore(Config config) : config_(std::move(config)) {}
  absl::Status Load();
  bool RecoverTemp(const std::string& name, const std::string& path);
  // Records `sha256` as held with `bytes`, used at `now`, then applies the cap.
  void AddLocked(const std::string& sha256, int64_t bytes, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EvictLocked(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void SyncDirectory() const;

  const Config config_;
  std::atomic<uint64_t> temp_counter_{0};
  mutable absl::Mutex mu_;
  std::map<std::string, Use> entries_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun
