// The coordinator's jobs and their lifecycle:
//
//   PENDING ──> ASSIGNED ──> LOADING ──> RUNNING ──> SUCCEEDED
//      │            │           │           │
//      └────────────┴───────────┴───────────┴──────> FAILED | CANCELLED
//
// Only these moves are legal; SUCCEEDED, FAILED and CANCELLED are final. A failure records
// the failing host and its error text. Job ids are "job-<n>" in submission order.
//
// Persistence (choice): the table calls Config::on_change with a job's new manifest after every
// change, under its lock, so saves arrive in the order the changes happened; a restarted
// coordinator passes what was saved back as Config::restored (see RestoredAfterRestart).
//
// Lifetime: Create() returns an owned table; the clock must outlive it.
// Thread-safety: all methods are safe to call concurrently; on_change must not call the table.
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
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "coordinator/goodput.h"
#include "jobspec/job_states.h"
#include "meshrun/v1/job.pb.h"

namespace meshrun::coordinator {

// OK when `host` runs `job` as `incarnation`; else FAILED_PRECONDITION naming both (a report,
// checkpoint or preemption from a fenced or foreign worker).
absl::Status CheckJobMember(const v1::JobManifest& job, const std::string& host,
                            const std::string& incarnation);

// A saved manifest as a restarted coordinator takes it back at `now`: a RUNNING job stays
// RUNNING (its workers go on and report to the new coordinator); a job still PENDING,
// ASSIGNED or LOADING FAILED, since its launch died with the old coordinator.
v1::JobManifest RestoredAfterRestart(v1::JobManifest job, absl::Time now);

class JobTable {
 public:
  struct Config {
    Clock* clock = &RealClock();
    int64_t first_id = 1;  // ids are job-<first_id>, ...: past those a restart still knows of
    // Jobs from before a restart (RestoredAfterRestart), in any order; new ids continue after
    // theirs.
    std::vector<v1::JobManifest> restored;
    // Called with a job's manifest after each change; may be empty.
    std::function<void(const v1::JobManifest&)> on_change;
  };

  // Errors: INVALID_ARGUMENT when the clock is null or a restored job has no "job-<n>" id.
  static absl::StatusOr<std::unique_ptr<JobTable>> Create(Config config);

  // Records a new PENDING job and returns its id.
  std::string Add(const v1::JobSpec& spec);

  // Errors: NOT_FOUND (unknown job), FAILED_PRECONDITION (the move is not legal from the
  // job's current state; both states named).
  // With `attempts`, only while the job is in that run (JobManifest.attempts' size): ABORTED when
  // it restarted since, so a launch overtaken by a restart changes nothing.
  absl::Status Transition(const std::string& job_id, v1::JobState to,
                          std::optional<int> attempts = std::nullopt);

  // Moves a job to FAILED naming `host` and `error`. Errors: as Transition.
  absl::Status Fail(const std::string& job_id, const std::string& host, const std::string& error);

  // Ends the job's current run and makes it PENDING again, to start over from the checkpoint
  // `resume_from` (step `restored_step`): records a JobAttempt (naming `host` and `cause`, with
  // the run's wall time partitioned by goodput cause from its state times and `run_steps`, its
  // summaries: StepTimes::RunSamples), clears the run's mesh, hosts, compile time and state
  // times, and stamps the next run's PENDING now. Errors: NOT_FOUND, FAILED_PRECONDITION (a
  // final job).
  // `expected_attempts`: the attempts the caller saw; ABORTED when another failure restarted
  // the job since (then nothing changes). With `memory` (its step > 0) the next run restores
  // from the hosts' in-memory checkpoints instead (restored_step is then its step); the
  // attempt records which tier and the run's hosts.
  absl::Status Restart(const std::string& job_id, const std::string& host,
                       const std::string& cause, const std::string& resume_from,
                       int64_t restored_step, int expected_attempts,
                       absl::Span<const StepSample> run_steps,
                       const v1::MemoryRestore& memory = v1::MemoryRestore::default_instance());

  // Moves a job to CANCELLED. Errors: as Transition (a finished job cannot be cancelled).
  absl::Status Cancel(const std::string& job_id);

  // Applies `edit` to the job's manifest (mesh, compile results, progress). The edit must not
  // change job_id or state. Errors: NOT_FOUND.
  absl::Status Update(const std::string& job_id,
                      const std::function<void(v1::JobManifest&)>& edit);

  // Errors: NOT_FOUND.
  absl::StatusOr<v1::JobManifest> Get(const std::string& job_id) const;
  std::vector<v1::JobManifest> List() const;
  // security: the job's host -> incarnation map, without copying the manifest (a refusal names
  // the members). Errors: NOT_FOUND.
  absl::StatusOr<std::map<std::string, std::string>> HostIncarnations(
      const std::string& job_id) const;
  // security: `host`'s incarnation in the job, nullopt when it is not a member, without copying
  // the host map (asked for every telemetry summary under TLS). Errors: NOT_FOUND (unknown job).
  absl::StatusOr<std::optional<std::string>> HostIncarnation(const std::string& job_id,
                                                             const std::string& host) const;
  // scale: the host that relays `host`'s telemetry in the job (JobManifest.telemetry_relays);
  // empty when none does. Errors: NOT_FOUND (unknown job).
  absl::StatusOr<std::string> TelemetryRelayOf(const std::string& job_id,
                                               const std::string& host) const;

  // limits (--job_retention, --max_finished_jobs): removes the jobs in a final state that
  // finished more than `retention` ago (zero: none by age), then the earliest finished past the
  // newest `max_finished` (0: no cap). Returns their ids; the caller drops what else it holds
  // for them (telemetry history, saved manifests). on_change is not called.
  std::vector<std::string> PruneFinished(absl::Duration retention, int64_t max_finished);
  int64_t FinishedCount() const;  // jobs in a final state still held

  // Fails every unfinished job that runs on `host` with incarnation `incarnation`, with
  // `error`, and returns their ids.
  std::vector<std::string> FailJobsOnWorker(const std::string& host,
                                            const std::string& incarnation,
                                            const std::string& error);

 private:
  explicit JobTable(Config config) : config_(std::move(config)), next_id_(config_.first_id) {}
  absl::Status TransitionLocked(v1::JobManifest& job, v1::JobState to)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ChangedLocked(const v1::JobManifest& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  mutable absl::Mutex mu_;
  int64_t next_id_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, v1::JobManifest> jobs_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> order_ ABSL_GUARDED_BY(mu_);  // ids in submission order
};

}  // namespace meshrun::coordinator
