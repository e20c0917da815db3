// The coordinator's store of submitted program bytes (StableHLO), content-addressed by sha256,
// on disk under its state directory: the job table keeps specs without program bytes, so a
// job's manifest stays small however big its programs, and a listing copies none. Each
// unfinished job's programs are bound to it by sha256 (a few bytes per job, released when the
// job ends). Past `max_bytes` the least recently used files go (a file written or read within
// `keep_recent` is kept). The files, their durable writes, checks on read and the LRU are a
// ContentStore's (common/content_store.h): <sha256>.stablehlo in `directory`. Programs also
// arrive ahead of their job, streamed (Upload), and a spec then names them by sha256.
//
// Lifetime: Create() returns an owned store. Thread-safety: all methods are safe to call
// concurrently.
#pragma once

#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/strings/string_view.h"
#include "common/content_store.h"
#include "common/sha256.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::coordinator {

class ProgramStore {
 public:
  struct Config {
    std::string directory;  // created when missing
    int64_t max_bytes = int64_t{16} << 30;
    absl::Duration keep_recent = absl::Hours(1);
  };

  // One program's bytes arriving in order (UploadProgram): written to a temp file of the store
  // as they come and hashed; Finish makes them an entry. Destroying an unfinished upload
  // deletes its file. One caller at a time.
  class Upload {
   public:
    ~Upload();
    Upload(const Upload&) = delete;
    Upload& operator=(const Upload&) = delete;
    // Errors: INVALID_ARGUMENT (more bytes than announced), INTERNAL (the write failed; path
    // named). After an error the upload is void.
    absl::Status Append(absl::string_view bytes);
    // The entry's sha256. Errors: INVALID_ARGUMENT (fewer bytes than announced, or bytes of
    // another sha256 than announced: both named), INTERNAL (the install failed).
    absl::StatusOr<std::string> Finish();

   private:
    friend class ProgramStore;
    Upload(ContentStore* files, std::string sha256, int64_t total_bytes);

    ContentStore* const files_;
    const std::string sha256_;
    const int64_t total_bytes_;
    const std::string temp_path_;
    std::FILE* file_ = nullptr;
    Sha256 hash_;
    int64_t received_ = 0;
    bool finished_ = false;
  };

  // Errors: FAILED_PRECONDITION (the directory cannot be created; named).
  static absl::StatusOr<std::unique_ptr<ProgramStore>> Create(Config config);

  // Starts an upload of `total_bytes` (at least 1) whose sha256 is announced as `sha256`.
  // Errors: INVALID_ARGUMENT (`sha256` not 64 lowercase hex, `total_bytes` below 1),
  // INTERNAL (the temp file cannot be created; path named).
  absl::StatusOr<std::unique_ptr<Upload>> StartUpload(const std::string& sha256,
                                                      int64_t total_bytes);

  // Stores each program's bytes of `spec` (a program naming its stablehlo_sha256 instead must
  // be held already); returns role -> sha256, for Bind.
  // Errors: INTERNAL (a write failed; named), FAILED_PRECONDITION (programs[i] names a sha256
  // this store does not hold: upload it first).
  absl::StatusOr<std::map<std::string, std::string>> Write(const v1::JobSpec& spec);
  // `spec` without its program bytes or their sha256: what the job table keeps.
  static v1::JobSpec Stripped(v1::JobSpec spec);
  // Binds job `job_id`'s programs (Write's answer) until Release.
  void Bind(const std::string& job_id, std::map<std::string, std::string> programs);
  void Release(const std::string& job_id);

  // `program` of job `job_id` with its bytes back (unchanged when it holds them).
  // Errors: NOT_FOUND (the job has no such program bound, or its bytes are no longer held:
  // resubmit the job), DATA_LOSS (the file no longer matches its sha256; deleted).
  absl::StatusOr<v1::Program> Read(const std::string& job_id, v1::Program program);

  int64_t bytes() const;

 private:
  explicit ProgramStore(std::unique_ptr<ContentStore> files) : files_(std::move(files)) {}

  const std::unique_ptr<ContentStore> files_;
  mutable absl::Mutex mu_;
  std::map<std::string, std::map<std::string, std::string>> jobs_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun::coordinator
