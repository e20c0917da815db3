#include "coordinator_service/coordinator_limit_flags.h"

#include "absl/flags/flag.h"
#include "rpc/binary_setup.h"

ABSL_FLAG(std::string, data_root, "",
          "comma-separated directories (besides --state_dir; the flag may be repeated) where clients may name token "
          "shards, checkpoint directories and checkpoints to resume from; any other path is "
          "refused at submit");
ABSL_FLAG(double, submit_rate, 20,
          "SubmitJob calls a second each client may make after its burst; 0: unlimited");
ABSL_FLAG(double, submit_burst, 100, "SubmitJob calls a client may make at once");
ABSL_FLAG(absl::Duration, history_retention, absl::Hours(24 * 30),
          "telemetry history older than this is deleted (checked every minute); 0: forever");
ABSL_FLAG(int64_t, history_max_steps, 1000000,
          "telemetry history keeps at most this many steps per job; 0: every step");
ABSL_FLAG(absl::Duration, worker_forget_after, absl::Hours(1),
          "a DEAD or LEFT worker leaves the registry this long after its last heartbeat");
ABSL_FLAG(int64_t, program_store_bytes, int64_t{16} << 30,
          "bytes of submitted programs kept on disk under --state_dir/programs (least recently "
          "used go first)");
ABSL_FLAG(absl::Duration, job_retention, absl::Hours(24 * 7),
          "a finished job, its manifest and its telemetry history are forgotten this long after "
          "it ended (checked every minute); 0: kept");
ABSL_FLAG(int64_t, max_finished_jobs, 1000,
          "finished jobs kept; past this the earliest finished are forgotten with their "
          "telemetry history; 0: no cap");
ABSL_FLAG(int64_t, max_watch_streams, 1000,
          "WatchTelemetry streams served at once; more are refused (RESOURCE_EXHAUSTED); 0: "
          "unlimited");
ABSL_FLAG(int64_t, max_watch_streams_per_identity, 100,
          "WatchTelemetry streams one identity (a certificate's or token's role and name) may "
          "hold at once; view callers together hold at most half of --max_watch_streams");
ABSL_FLAG(int64_t, max_slow_calls_per_identity, 32,
          "slow calls (see --max_slow_calls) one identity may have in flight at once; view "
          "callers together at most half of --max_slow_calls");
ABSL_FLAG(int64_t, max_upload_streams, 10000,
          "UploadTelemetry and RelayTelemetry streams (workers' telemetry, one a worker, and "
          "one more a telemetry relay) served at once, and as "
          "many StreamHeartbeats streams (workers' liveness, one a worker); more are refused "
          "(RESOURCE_EXHAUSTED); 0: unlimited");
ABSL_FLAG(int64_t, max_slow_calls, 256,
          "calls that wait on disk or workers (SubmitJob, UploadProgram, GetMetrics, "
          "GetDeviceMemory, "
          "DrainWorker, CheckpointJob, PreemptJob, job and checkpoint reports) served at once, "
          "each on a thread of its own; more are refused (RESOURCE_EXHAUSTED); 0: unlimited");
ABSL_FLAG(int64_t, max_request_bytes, int64_t{8} << 20,
          "largest request message taken (programs come in 1 MiB chunks of UploadProgram); "
          "larger ones are refused (RESOURCE_EXHAUSTED)");
ABSL_FLAG(int64_t, max_request_memory, int64_t{1} << 30,
          "memory for requests being received, all callers together; past it gRPC resets "
          "streams (RESOURCE_EXHAUSTED \"Buffers full\") instead of growing");

namespace meshrun::services {

CoordinatorLimits CoordinatorLimitsFromFlags() {
  return {.data_roots = RepeatedFlagValues("data_root", absl::GetFlag(FLAGS_data_root)),
          .submit_rate = absl::GetFlag(FLAGS_submit_rate),
          .submit_burst = absl::GetFlag(FLAGS_submit_burst),
          .history_retention = absl::GetFlag(FLAGS_history_retention),
          .history_max_steps = absl::GetFlag(FLAGS_history_max_steps),
          .worker_forget_after = absl::GetFlag(FLAGS_worker_forget_after),
          .program_store_bytes = absl::GetFlag(FLAGS_program_store_bytes),
          .job_retention = absl::GetFlag(FLAGS_job_retention),
          .max_finished_jobs = absl::GetFlag(FLAGS_max_finished_jobs),
          .max_watch_streams = absl::GetFlag(FLAGS_max_watch_streams),
          .max_upload_streams = absl::GetFlag(FLAGS_max_upload_streams),
          .max_slow_calls = absl::GetFlag(FLAGS_max_slow_calls),
          .max_watch_streams_per_identity = absl::GetFlag(FLAGS_max_watch_streams_per_identity),
          .max_slow_calls_per_identity = absl::GetFlag(FLAGS_max_slow_calls_per_identity),
          .max_request_bytes = absl::GetFlag(FLAGS_max_request_bytes),
          .max_request_memory = absl::GetFlag(FLAGS_max_request_memory)};
}

}  // namespace meshrun::services
