// The coordinator's telemetry path: host summaries are validated and combined per step
// (telemetry/step_combiner), persisted (telemetry/history_store, SQLite) and fanned out to
// watchers (telemetry/watch_hub). A host summary is acknowledged only once it is on disk:
// a step's host summaries are kept in memory until the step is combined, then committed with
// its global summary in one transaction and published; the commit's fsync runs after that on
// a thread of its own (common/after_sync.h, one fsync for the steps committed meanwhile),
// which then acknowledges them through each host's ack route (RouteAcks). A summary that misses
// its step's grace (late) is committed and synced on its own.
//
// Restart: StartJob records the job as collecting in the history (hosts, replica counts,
// declarations); EndJob clears it. A coordinator created on the same database resumes every job
// still collecting — it was killed mid-job — so the workers' resent summaries are combined, not
// refused: the combiner counts the steps in history as emitted, and the summaries of the steps
// pending at the crash were not acknowledged, so the workers send them again; no step is
// emitted twice or lost. A resumed job ends when each of its hosts reports its end
// (HostEnded), since the restarted coordinator's job table no longer knows it.
//
// Lifetime: Create() starts a timer thread for grace deadlines (it sleeps until the next one,
// at most a second) and the acknowledgements' thread; the destructor stops both, after a last
// sync and the acknowledgements it covers.
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/after_sync.h"
#include "coordinator/straggler_detector.h"
#include "coordinator/goodput.h"
#include "meshrun/v1/job.pb.h"
#include "meshrun/v1/telemetry.pb.h"
#include "telemetry/history_store.h"
#include "telemetry/step_combiner.h"
#include "telemetry/watch_hub.h"

namespace meshrun::coordinator {
class WorkerRegistry;
}

namespace meshrun::services {

class CoordinatorTelemetry {
 public:
  struct Config {
    std::string database;                      // SQLite file of the telemetry history
    absl::Duration grace = absl::Seconds(5);   // wait for missing hosts before "partial"
    size_t watcher_capacity = 1024;            // summaries queued per watcher
    // When set, Accept refuses a summary carrying an incarnation for which this returns an
    // error (the registry's fence: DEAD or replaced incarnations), with that error.
    std::function<absl::Status(const std::string& host, const std::string& incarnation)> admit;
    // The history's retention (telemetry::HistoryStore::Config), applied when the owner calls
    // history().Prune(); zero: keep.
    absl::Duration history_max_age = absl::ZeroDuration();
    int64_t history_max_steps = 0;
    // When set, called once per job run with the first committed global step whose scalar
    // series `series` is NaN or infinite (the manifest's nonfinite_step), on the combiner's
    // thread after the step was committed; it must not call back into this object.
    std::function<void(const std::string& job_id, int64_t step, const std::string& series)>
        on_nonfinite;
  };

  // The coordinator's Config::admit: a summary passes only from its host's current, ALIVE
  // incarnation (WorkerRegistry::CheckCurrent), so late telemetry of an incarnation declared
  // DEAD or replaced is refused (FAILED_PRECONDITION) and nothing of it is stored. A host the
  // registry does not know (not yet re-registered after a coordinator restart) passes.
  // `registry` must outlive the returned function.
  static std::function<absl::Status(const std::string&, const std::string&)> RegistryFence(
      coordinator::WorkerRegistry* registry);

  // Errors: those of HistoryStore::Create (the database path named).
  static absl::StatusOr<std::unique_ptr<CoordinatorTelemetry>> Create(Config config);
  ~CoordinatorTelemetry();

  // Makes a submitted job watchable at once (its watchers wait for the first summary).
  // Errors: INVALID_ARGUMENT (bad declarations), ALREADY_EXISTS.
  absl::Status DeclareJob(const std::string& job_id, const v1::JobSpec& spec);
  // Starts collecting a declared job's summaries from the hosts of its mesh.
  // Errors: INVALID_ARGUMENT (no hosts or bad declarations), ALREADY_EXISTS.
  absl::Status StartJob(const v1::JobManifest& job);
  // A job restarted from a checkpoint (automatic recovery) on the hosts of `job`: the old run's
  // pending steps are dropped, the history after job.restored_step() is dropped (the new run
  // computes those steps again, so the history keeps one value per step, the newest), watchers
  // get a rewind event and go on, and summaries of the earlier runs are no longer taken.
  // Errors: as StartJob, and the store's.
  absl::Status RestartJob(const v1::JobManifest& job);
  // Emits what is pending (partial where hosts are missing) and ends the job's watchers.
  void EndJob(const std::string& job_id);
  // limits (--job_retention): forgets a finished job the job table pruned: ends it (EndJob),
  // drops what is held for it in memory and its history (HistoryStore::ForgetJob, with
  // `job_number` so its id is never reused). Errors: the store's.
  absl::Status ForgetJob(const std::string& job_id, int64_t job_number);
  // A host of a job resumed after a restart ended it; the job ends when all its hosts did.
  // Returns false when the job is not a resumed one.
  bool HostEnded(const std::string& job_id, const std::string& host);
  // Every job id with telemetry history, and "job-<n>" of the highest forgotten one (for ids
  // that must not be reused after a restart).
  absl::StatusOr<std::vector<std::string>> KnownJobs() const;

  // Called with (job_id, persisted_through_step) once a host's summaries of the job through
  // that step are committed.
  using AckFn = std::function<void(const std::string& job_id, int64_t persisted_through_step)>;
  // Sends `host`'s acknowledgements of summaries Accept kept pending to `ack` (replacing an
  // earlier route of the host: its newest stream). `ack` runs on the acknowledgements' thread
  // once the step's commit is synced, with this object's route lock held: it must not call
  // RouteAcks or UnrouteAcks.
  // Returns the route's id.
  int64_t RouteAcks(const std::string& host, AckFn ack);
  // Removes the route (no-op when a newer one replaced it); once this returns, its `ack` is
  // never called again.
  void UnrouteAcks(const std::string& host, int64_t route);

  // Validates and combines one host summary. Returns the host's persisted step to acknowledge
  // now (a duplicate, a late summary committed here, an earlier run's), or nullopt when the
  // summary waits for its step: the step's commit acknowledges it through the host's route.
  // Errors: NOT_FOUND (job not collecting), INVALID_ARGUMENT (field named), the store's,
  // Config::admit's (a fenced incarnation).
  // Taken by value: a caller done with its summary moves it in, and the step keeps it.
  absl::StatusOr<std::optional<int64_t>> Accept(v1::HostSummary summary);
  // The highest step any host reported telemetry for (0: none yet): a running job's current
  // step, to the telemetry cadence, for `meshrun list` and /api/jobs.
  int64_t LatestStep(const std::string& job_id) const;
  // Raises a job's last_step to LatestStep while it runs (GetJob, ListJobs, /api/jobs).
  void ShowLiveStep(v1::JobManifest* job) const;

  // Hosts of a collecting job that the straggler detector flags now (sorted; docs/liveness.md).
  std::vector<std::string> Stragglers(const std::string& job_id) {
    return stragglers_->Flagged(job_id);
  }

  telemetry::WatchHub& hub() { return *hub_; }
  telemetry::HistoryStore& history() { return *history_; }
  // Each job's step times from its committed summaries (goodput, coordinator/goodput.h).
  const coordinator::StepTimes& step_times() const { return step_times_; }

 private:
  CoordinatorTelemetry() = default;
  void PollLoop();
  absl::Status StartCombining(const v1::JobManifest& job, int64_t emitted_through_step);
  // Accept takes only the summaries of run `attempt` on; a rewind lowers the live step.
  void SetRun(const std::string& job_id, int attempt, std::optional<int64_t> rewound_to);
  // Reports the summary's first non-finite scalar series, once per job (Config::on_nonfinite).
  void NoteNonFinite(
      const v1::GlobalSummary& summary,
      const std::function<void(const std::string&, int64_t, const std::string&)>& report);
  // Resumes the jobs the history says were collecting (see "Restart").
  absl::Status Resume();
  absl::Status ResumeJob(const std::string& job_id, const std::string& setup);
  // Acknowledges a committed, synced step to each of `hosts` it combined (RouteAcks).
  void AckCommitted(const std::string& job_id, int64_t step,
                    const std::vector<std::string>& hosts);

  std::function<absl::Status(const std::string&, const std::string&)> admit_;
  std::unique_ptr<telemetry::HistoryStore> history_;
  std::unique_ptr<telemetry::WatchHub> hub_;
  coordinator::StepTimes step_times_;
  std::unique_ptr<telemetry::StepCombiner> combiner_;
  std::unique_ptr<coordinator::StragglerDetector> stragglers_;
  mutable absl::Mutex steps_mu_;
  std::map<std::string, int64_t> latest_step_ ABSL_GUARDED_BY(steps_mu_);
  std::map<std::string, int> run_ ABSL_GUARDED_BY(steps_mu_);  // the attempt being collected
  // Jobs whose first non-finite step was reported (Config::on_nonfinite).
  std::set<std::string> nonfinite_noted_ ABSL_GUARDED_BY(steps_mu_);
  absl::Mutex mu_;
  std::map<std::string, std::set<std::string>> resumed_ ABSL_GUARDED_BY(mu_);  // hosts to end
  struct AckRoute {
    int64_t id = 0;
    AckFn ack;
  };
  absl::Mutex routes_mu_;
  std::map<std::string, AckRoute> routes_ ABSL_GUARDED_BY(routes_mu_);  // by host
  int64_t next_route_ ABSL_GUARDED_BY(routes_mu_) = 0;
  std::unique_ptr<AfterSync> synced_acks_;  // AckCommitted, after the history's Sync
  absl::Duration max_poll_wait_;  // the poller's longest sleep: min(grace, 1 s)
  absl::Notification stop_;
  std::thread poller_;
};

}  // namespace meshrun::services
