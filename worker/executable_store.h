// The worker's local store of serialized executables, by fingerprint (the sha256 of the
// bytes). Transfers land in a temp file and become visible only when complete and verified,
// so a truncated or corrupted transfer leaves nothing behind. Survives restarts: the worker
// reports what it holds when it registers, and the coordinator skips sending those.
//
// Lifetime: Create() returns an owned store; an Upload must not outlive it.
// Thread-safety: Store methods are safe to call concurrently; one Upload belongs to one
// caller at a time.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sha256.h"

namespace meshrun::worker {

class ExecutableStore {
 public:
  static constexpr int64_t kMaxChunkBytes = 1 << 20;

  // An executable arriving in order, chunk by chunk.
  class Upload {
   public:
    ~Upload();  // an unfinished upload is discarded
    // Errors: INVALID_ARGUMENT (offset not where the previous chunk ended, chunk over 1 MiB,
    // more bytes than announced), INTERNAL (write failed).
    absl::Status Append(int64_t offset, absl::string_view data);
    // Verifies the length and both digests (announced `sha256` and the fingerprint), then makes
    // the executable visible. Errors: DATA_LOSS (truncated or checksum mismatch; discarded).
    absl::Status Commit(const std::string& sha256);
    int64_t received() const { return received_; }

   private:
    friend class ExecutableStore;
    Upload(std::string fingerprint, int64_t total, std::string temp_path, std::string final_path,
           int fd);
    std::string fingerprint_;
    int64_t total_;
    std::string temp_path_, final_path_;
    int fd_;
    int64_t received_ = 0;
    Sha256 hasher_;
    bool done_ = false;
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
