// The worker's local store of serialized executables, by fingerprint (the sha256 of the
// bytes). Transfers land in a temp file and become visible only when complete and verified,
// so a truncated or corrupted transfer leaves nothing behind. Survives restarts: the worker
// reports what it holds when it registers, and the coordinator skips sending those.
//
// Lifetime: Create() returns an owned store; an Upload must not outlive it.
// Thread-safety: Store methods are safe to call concurrently; one Upload belongs to one
// caller at a time (its own thread is internal).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"

namespace meshrun::worker {

class ExecutableStore {
 public:
  static constexpr int64_t kMaxChunkBytes = 1 << 20;

  // An executable arriving in order, chunk by chunk. Append only checks and queues a chunk
  // (at most kMaxQueuedChunks wait; then it blocks): a thread of the upload hashes and writes
  // it, so the caller can receive the next chunk meanwhile. It also starts writing the file
  // back to disk as it goes, so Commit's fsync has little left to wait for.
  class Upload {
   public:
    static constexpr int kMaxQueuedChunks = 4;
    ~Upload();  // an unfinished upload is discarded
    // Errors: INVALID_ARGUMENT (offset not where the previous chunk ended, chunk over 1 MiB,
    // more bytes than announced), INTERNAL (an earlier chunk's write failed),
    // FAILED_PRECONDITION (after Commit).
    absl::Status Append(int64_t offset, absl::string_view data);
    // The same, taking the bytes of `*data` without copying them; `*data` is left empty,
    // holding a buffer of an earlier chunk when one is free, so that refilling it (the next
    // message parsed into it) need not allocate and fault in fresh memory.
    absl::Status Append(int64_t offset, std::string* data);
    // Whether Append can queue another chunk without waiting. If not, `wake` runs once, on the
    // upload's thread, as soon as it can (or a write failed), so an asynchronous caller can
    // stop receiving meanwhile instead of blocking its thread.
    bool HasRoomOrNotify(std::function<void()> wake);
    // Waits for the queued chunks, verifies the length and both digests (announced `sha256`
    // and the fingerprint), fsyncs the file, renames it into place and fsyncs the directory,
    // so an acknowledged executable survives a crash. Call at most once.
    // Errors: DATA_LOSS (truncated or checksum mismatch; discarded), INTERNAL (write, fsync or
    // rename failed: discarded; or the directory's fsync failed), FAILED_PRECONDITION (called
    // twice).
    absl::Status Commit(const std::string& sha256);
    int64_t received() const { return received_; }

   private:
    friend class ExecutableStore;
    Upload(std::string fingerprint, int64_t total, std::string temp_path, std::string final_path,
           std::string directory, int fd);
    absl::Status Check(int64_t offset, size_t size) const;
    void WriteLoop();  // the upload's thread: hashes and writes queued chunks in order
    void StopWriter();  // finishes the queue (emptied first when discarding) and joins
    bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || closing_; }
    bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queue_.size() < kMaxQueuedChunks || !write_status_.ok();
    }

    const std::string fingerprint_;
    const int64_t total_;
    const std::string temp_path_, final_path_, directory_;
    int fd_;
    int64_t received_ = 0;  // queued bytes; the caller's thread only
    bool done_ = false;
    absl::Mutex mu_;
    std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
    std::vector<std::string> spare_ ABSL_GUARDED_BY(mu_);  // written chunks' buffers, for reuse
    bool closing_ ABSL_GUARDED_BY(mu_) = false;  // no more chunks: finish the queue and exit
    absl::Status write_status_ ABSL_GUARDED_BY(mu_);
    std::function<void()> wake_ ABSL_GUARDED_BY(mu_);  // from HasRoomOrNotify
    Sha256 hasher_;  // the writer thread's until it has exited
    std::thread writer_;
  };

  // Errors: FAILED_PRECONDITION (directory cannot be created; path named).
  static absl::StatusOr<std::unique_ptr<ExecutableStore>> Create(const std::string& directory);

  // Errors: INVALID_ARGUMENT (fingerprint not 64 lowercase hex, total not positive),
  // INTERNAL (temp file cannot be created).
  absl::StatusOr<std::unique_ptr<Upload>> Begin(const std::string& fingerprint, int64_t total);

  bool Has(const std::string& fingerprint) const;
  // Errors: NOT_FOUND; DATA_LOSS when the file no longer matches its fingerprint (deleted).
  absl::StatusOr<std::string> Read(const std::string& fingerprint) const;
  std::vector<std::string> Fingerprints() const;

 private:
  explicit ExecutableStore(std::string directory) : directory_(std::move(directory)) {}
  std::string PathOf(const std::string& fingerprint) const;
  const std::string directory_;
};

}  // namespace meshrun::worker
