// The coordinator's store of submitted program bytes (StableHLO), content-addressed by sha256,
// on disk under its state directory: the job table keeps specs without program bytes, so a
// job's manifest stays small however big its programs, and a listing copies none. Each
// unfinished job's programs are bound to it by sha256 (a few bytes per job, released when the
// job ends). Past `max_bytes` the least recently used files go (a file written or read within
// `keep_recent` is kept). The files, their durable writes, checks on read and the LRU are a
// ContentStore's (common/content_store.h): <sha256>.stablehlo in `directory`.
//
// Lifetime: Create() returns an owned store. Thread-safety: all methods are safe to call
// concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/content_store.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::coordinator {

class ProgramStore {
 public:
  struct Config {
    std::string directory;  // created when missing
    int64_t max_bytes = int64_t{16} << 30;
    absl::Duration keep_recent = absl::Hours(1);
  };

  // Errors: FAILED_PRECONDITION (the directory cannot be created; named).
  static absl::StatusOr<std::unique_ptr<ProgramStore>> Create(Config config);

  // Stores each program's bytes of `spec`; returns role -> sha256, for Bind.
  // Errors: INTERNAL (a write failed; named).
  absl::StatusOr<std::map<std::string, std::string>> Write(const v1::JobSpec& spec);
  // `spec` without its program bytes: what the job table keeps.
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
