// The coordinator's bounds that are not a component's own (docs/limits.md): which directories
// it reads client-named files in, the per-client SubmitJob rate, where program bytes live, and
// the retention applied to its tables on a schedule. SubmitAdmission is what SubmitJob consults
// before it stores anything.
//
// Lifetime: Create() returns an owned object. Thread-safety: all methods are safe to call
// concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/path_roots.h"
#include "coordinator/program_store.h"
#include "coordinator/rate_limiter.h"
#include "meshrun/v1/job.pb.h"

namespace grpc {
class ServerContextBase;
}  // namespace grpc

namespace meshrun::services {

// A caller as the rate limits count it: its authenticated identity with TLS ("submit/ci"),
// else its address without the port ("ipv4:127.0.0.1").
std::string ClientKey(const grpc::ServerContextBase& context);

struct CoordinatorLimits {
  // Comma-separated directories (besides the state directory) holding token shards,
  // checkpoints and resume_from checkpoints that clients may name (--data_root).
  std::string data_roots;
  double submit_rate = 20;    // SubmitJob calls a second per client; 0: unlimited
  double submit_burst = 100;  // calls a client may make at once
  // Telemetry history kept per job (--history_retention, --history_max_steps); zero: forever /
  // every step. Applied every minute.
  absl::Duration history_retention = absl::Hours(24 * 30);
  int64_t history_max_steps = 1000000;
  absl::Duration worker_forget_after = absl::Hours(1);  // DEAD/LEFT workers leave the registry
  int64_t program_store_bytes = int64_t{16} << 30;       // submitted programs on disk
  // Concurrent telemetry streams: dashboards' WatchTelemetry, workers' UploadTelemetry (one
  // each, plus a few while a job restarts), and as many workers' StreamHeartbeats; 0:
  // unlimited. Past them: RESOURCE_EXHAUSTED.
  // Finished jobs leave the job table (and their telemetry history goes) this long after
  // they ended, and past the newest max_finished_jobs; zero: keep. Applied every minute, and
  // within a liveness sweep once the cap is passed by 10%.
  absl::Duration job_retention = absl::Hours(24 * 7);
  int64_t max_finished_jobs = 1000;
  int64_t max_watch_streams = 1000;
  int64_t max_upload_streams = 10000;
  // Calls that wait on disk or workers (SubmitJob, UploadProgram, GetMetrics, GetDeviceMemory,
  // DrainWorker, CheckpointJob, PreemptJob, ReportJobProgress, ReportCheckpoint) run on a thread each, off
  // gRPC's callback threads; this many at once, more are refused (RESOURCE_EXHAUSTED); 0:
  // unlimited.
  int64_t max_slow_calls = 256;
  // One identity's share of the watch streams and of the slow calls (rpc/identity_slots.h);
  // view callers share half of each limit, apart from admin, submit and worker callers.
  int64_t max_watch_streams_per_identity = 100;
  int64_t max_slow_calls_per_identity = 32;
  // One request message at most (programs come by UploadProgram, in chunks); larger ones are
  // refused with gRPC's RESOURCE_EXHAUSTED. Memory for all requests being received: past it
  // gRPC resets streams (rpc/server_support.h, ReceiveLimits).
  int64_t max_request_bytes = int64_t{8} << 20;
  int64_t max_request_memory = int64_t{1} << 30;
};

// Errors: INVALID_ARGUMENT naming --max_request_bytes (below 2 MiB, where a 1 MiB chunk or
// value no longer fits, or past gRPC's int) or --max_request_memory (below one request).
absl::Status CheckRequestLimits(const CoordinatorLimits& limits);

class SubmitAdmission {
 public:
  // Errors: INVALID_ARGUMENT (a --data_root entry; named), FAILED_PRECONDITION (the program
  // store directory under `state_dir` cannot be created).
  static absl::StatusOr<std::unique_ptr<SubmitAdmission>> Create(const CoordinatorLimits& limits,
                                                                 const std::string& state_dir);

  // The rate limit of `client`, then the paths `spec` names (jobspec::CheckSpecPaths).
  // Errors: RESOURCE_EXHAUSTED (over the rate), INVALID_ARGUMENT (a path outside the roots).
  absl::Status Admit(const std::string& client, const v1::JobSpec& spec);

  coordinator::ProgramStore* programs() { return programs_.get(); }
  const PathRoots& roots() const { return roots_; }

 private:
  SubmitAdmission() = default;
  PathRoots roots_;
  std::unique_ptr<coordinator::RateLimiter> rate_;
  std::unique_ptr<coordinator::ProgramStore> programs_;
};

}  // namespace meshrun::services
