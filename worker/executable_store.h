// The worker's local store of serialized executables, by fingerprint (the sha256 of the
// bytes). Transfers land in a temp file and become visible only when complete and verified,
// so a truncated or corrupted transfer leaves nothing behind. A committed executable is
// readable at once; the store's flusher thread then makes it durable (fsync, rename to its
// final name, fsync of the directory), so acknowledging a transfer never waits for the disk.
// Survives restarts: Create() keeps a committed file that a crash caught before its flush if
// it still hashes to its fingerprint (a power loss may have torn it: then it is deleted and
// the coordinator sends it again), and the worker reports what it holds when it registers.
// The durable files (<fingerprint>.xexe), their flush, checks on read, the LRU cap and that
// recovery are a ContentStore's (common/content_store.h); uploads and the not-yet-durable
// committed files are this store's.
//
// Lifetime: Create() returns an owned store; an Upload must not outlive it. Destroying the
// store first flushes what was committed.
// Thread-safety: Store methods are safe to call concurrently; one Upload belongs to one
// caller at a time (its own thread is internal).
#pragma once

#include <cstdint>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/content_store.h"
#include "common/protocol.h"
#include "common/sha256.h"

namespace meshrun::worker {

class ExecutableStore {
 public:
  static constexpr int64_t kMaxChunkBytes = kMaxExecutableChunkBytes;

  // An executable arriving in order, chunk by chunk. Append only checks and queues a chunk
  // (at most kMaxQueuedChunks wait; then it blocks): a thread of the upload hashes and writes
  // it, so the caller can receive the next chunk meanwhile.
  class Upload {
   public:
    static constexpr int kMaxQueuedChunks = 4;
    ~Upload();  // an unfinished upload is discarded
    // With `crc32c`, the upload's thread checks the chunk against it (common/crc32c.h) before
    // writing it: a chunk corrupted in transit fails the upload with DATA_LOSS, reported by the
    // next Append or by Commit.
    // Errors: INVALID_ARGUMENT (offset not where the previous chunk ended, chunk over 1 MiB,
    // more bytes than announced), INTERNAL (an earlier chunk's write failed), DATA_LOSS (an
    // earlier chunk did not match its crc32c), FAILED_PRECONDITION (after Commit).
    absl::Status Append(int64_t offset, absl::string_view data,
                        std::optional<uint32_t> crc32c = std::nullopt);
    // The same, taking the bytes of `*data` without copying them; `*data` is left empty,
    // holding a buffer of an earlier chunk when one is free, so that refilling it (the next
    // message parsed into it) need not allocate and fault in fresh memory.
    absl::Status Append(int64_t offset, std::string* data,
                        std::optional<uint32_t> crc32c = std::nullopt);
    // Whether Append can queue another chunk without waiting. If not, `wake` runs once, on the
    // upload's thread, as soon as it can (or a write failed), so an asynchronous caller can
    // stop receiving meanwhile instead of blocking its thread.
    bool HasRoomOrNotify(std::function<void()> wake);
    // Waits for the queued chunks, verifies the length and both digests (announced `sha256`
    // and the fingerprint; with Verify::kOnRead only that they are equal), and hands the file
    // to the store: readable from now on, durable once the flusher is done with it. Call at
    // most once.
    // Errors: DATA_LOSS (truncated, checksum or crc32c mismatch; discarded), INTERNAL (a
    // write failed: discarded), FAILED_PRECONDITION (called twice).
    absl::Status Commit(const std::string& sha256);
    int64_t received() const { return received_; }

   private:
    friend class ExecutableStore;
    Upload(ExecutableStore* store, std::string fingerprint, int64_t total, std::string temp_path,
           int fd, bool hash);
    absl::Status Check(int64_t offset, size_t size) const;
    struct Chunk {
      int64_t offset = 0;
      std::string data;
      std::optional<uint32_t> crc32c;
    };
    void WriteLoop();  // the upload's thread: checks, hashes and writes queued chunks in order
    void StopWriter();  // finishes the queue (emptied first when discarding) and joins
    bool HasWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty() || closing_; }
    bool HasRoom() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return queue_.size() < kMaxQueuedChunks || !write_status_.ok();
    }

    ExecutableStore* const store_;
    const std::string fingerprint_;
    const int64_t total_;
    const std::string temp_path_;
    const bool hash_;  // Verify::kOnReceive
    int fd_;
    int64_t received_ = 0;  // queued bytes; the caller's thread only
    bool done_ = false;
    absl::Mutex mu_;
    std::deque<Chunk> queue_ ABSL_GUARDED_BY(mu_);
    std::vector<std::string> spare_ ABSL_GUARDED_BY(mu_);  // written chunks' buffers, for reuse
    bool closing_ ABSL_GUARDED_BY(mu_) = false;  // no more chunks: finish the queue and exit
    absl::Status write_status_ ABSL_GUARDED_BY(mu_);
    std::function<void()> wake_ ABSL_GUARDED_BY(mu_);  // from HasRoomOrNotify
    Sha256 hasher_;  // the writer thread's until it has exited
    std::thread writer_;
  };

  // Bounds (docs/limits.md).
  struct Limits {
    // Durable executables past this many bytes are deleted, least recently used first (an
    // executable used within keep_recent is kept, so a job being loaded never loses its own).
    int64_t max_bytes = int64_t{32} << 30;
    absl::Duration keep_recent = absl::Minutes(10);
    int64_t max_executable_bytes = int64_t{8} << 30;  // an upload's announced total
    int max_uploads = 8;                               // uploads in progress at once
  };

  // Errors: FAILED_PRECONDITION (directory cannot be created; path named).
  static absl::StatusOr<std::unique_ptr<ExecutableStore>> Create(const std::string& directory,
                                                                 Limits limits);
  static absl::StatusOr<std::unique_ptr<ExecutableStore>> Create(const std::string& directory) {
    return Create(directory, Limits());
  }
  ~ExecutableStore();

  // When an upload checks that its bytes hash to the fingerprint.
  enum class Verify {
    // As they arrive (the upload's thread hashes each chunk): Commit fails with DATA_LOSS on a
    // mismatch, so the sender learns at once. For links without integrity of their own.
    kOnReceive,
    // Only when read: Commit checks the length and that the announced sha256 is the
    // fingerprint, not the bytes. For links whose transport already authenticates every byte
    // (mutual TLS: AEAD records, in order), or whose chunks carry a crc32c against corruption
    // in transit (plaintext: the fingerprint travels on the same unauthenticated link, so a
    // hash on receive adds nothing against tampering); Read's hash still catches a sender that
    // announced the wrong fingerprint, and the disk. Saves one sha256 pass over every
    // executable.
    kOnRead,
  };

  // Errors: INVALID_ARGUMENT (fingerprint not 64 lowercase hex, total not positive or over
  // max_executable_bytes), RESOURCE_EXHAUSTED (max_uploads in progress), INTERNAL (temp file
  // cannot be created).
  absl::StatusOr<std::unique_ptr<Upload>> Begin(const std::string& fingerprint, int64_t total,
                                                Verify verify = Verify::kOnReceive);

  bool Has(const std::string& fingerprint) const;
  // Errors: NOT_FOUND; DATA_LOSS when the file no longer matches its fingerprint (deleted).
  absl::StatusOr<std::string> Read(const std::string& fingerprint) const;
  std::vector<std::string> Fingerprints() const;
  // Bytes of the durable executables (what the LRU cap counts).
  int64_t DurableBytes() const;
  // Blocks until every executable committed so far is durable under its final name.
  void Flush();

 private:
  ExecutableStore(std::unique_ptr<ContentStore> files, Limits limits);
  // Commit's hand-over: `temp_path` holds the verified bytes of `fingerprint`.
  void Publish(const std::string& fingerprint, const std::string& temp_path);
  void FlushLoop();  // the flusher thread: makes published files durable, in order
  bool HasFlushWork() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !to_flush_.empty();
  }
  bool AllDurable() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return pending_.empty() && !flushing_;
  }

  const std::unique_ptr<ContentStore> files_;  // the durable executables
  const Limits limits_;
  std::atomic<int> uploads_{0};
  mutable absl::Mutex mu_;  // taken before files_'s own lock, never while files_ holds it
  // Committed, not yet durable: fingerprint -> temp path (until files_ has installed it).
  mutable std::map<std::string, std::string> pending_ ABSL_GUARDED_BY(mu_);  // Read drops corrupt ones
  std::deque<std::string> to_flush_ ABSL_GUARDED_BY(mu_);  // fingerprints, commit order
  bool flushing_ ABSL_GUARDED_BY(mu_) = false;  // the flusher is working on one
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread flusher_;
};

}  // namespace meshrun::worker
