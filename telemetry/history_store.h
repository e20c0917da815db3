// The coordinator's telemetry history: a SQLite database (one file, WAL journal) of every
// global summary, the host summaries they were combined from, and each series' values in a
// narrow table for range queries. Implemented in history_store.cc (schema, writes),
// history_read.cc (reads), history_retention.cc (rewind, pruning), history_forget.cc
// (forgetting a job) and history_sqlite.h.
//
// Durability: a call that returns OK has committed its transaction. With the default
// `synchronous_full` the commit is fsynced (survives power loss), except an Append asked for
// Durability::kDeferred, whose fsync waits for Sync(); with it off (synchronous=NORMAL) a
// commit survives the process being killed (kill -9) but not the machine losing power.
// An acknowledgement (UploadTelemetryAck) must only be sent after the host summary was
// committed and synced: by the Append of the global summary holding it in host_detail (then
// Sync() when deferred), or by AppendHost (a late one); a summary must only be published
// (WatchHub::Publish) after Append returned OK — the hub's backfill/live seam relies on it.
//
// Schema (user_version 2; a version-1 file is converted when opened):
//   jobs(job_id, created_micros, latest_step)               one row per job with history
//   job_series(job_id, name, declaration)                   the series a job declared or sent
//   global_summaries(job_id, step, inserted_micros, summary) GlobalSummary without host_detail
//   series_points(job_id, name, element, step, value)       one row per element per step;
//                                                           NaN is stored as NULL. Keyed
//                                                           step-major (job_id, step, name,
//                                                           element): a step's points share a
//                                                           page or two, which is what its
//                                                           commit writes (version 1, keyed
//                                                           by element first, wrote a page per
//                                                           element); a series read scans the
//                                                           points of every series in its
//                                                           steps.
//   host_summaries(job_id, step, host, host_index, inserted_micros, summary)
//   host_progress(job_id, host, persisted_through_step)     survives pruning
//   collecting(job_id, setup)                               jobs collecting telemetry now, with
//                                                           an opaque setup to resume them from
//
// Retention: Prune() (called by the owner, e.g. once a minute) deletes, per job, global and
// host summaries and series points older than `max_age` (by insertion time on the injected
// clock) and all but the newest `max_steps_per_job` steps; zero disables a limit. A job whose
// rows are all pruned away by age is forgotten. LatestStep and host progress are kept for a
// job that still exists, so resume and acknowledgements never move backwards.
//
// Lifetime: Create() opens (or creates) the database and returns an owned store; the clock
// must outlive it. Several processes must not open the same file at once.
// Thread-safety: every method is safe to call concurrently (one connection, one mutex).
// Errors common to every method: INTERNAL (a SQLite failure, its message included),
// DATA_LOSS (the database file is corrupt or a stored row does not parse), RESOURCE_EXHAUSTED
// (the disk is full).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "meshrun/v1/telemetry.pb.h"

struct sqlite3;
struct sqlite3_stmt;

namespace meshrun::telemetry {

// Keeps only the values named in `names` (all when empty). Shared by history reads and
// watchers, which narrow summaries to the series a caller asked for.
void FilterValues(const std::set<std::string>& names,
                  google::protobuf::RepeatedPtrField<v1::TelemetryValue>& values);

// NOT_FOUND for a series `name` that job `job_id` does not have, listing the ones it has
// (`series`, in order) so the caller can correct the name.
absl::Status UnknownSeriesError(const std::string& name, const std::string& job_id,
                                const std::vector<std::string>& series);

namespace history_internal {
// A prepared statement kept by HistoryStore; `in_use` while a caller holds it.
struct CachedStatement {
  sqlite3_stmt* stmt = nullptr;
  bool in_use = false;
};
// By SQL text; std::less<> finds by string_view, without a copy of the text.
using StatementCache = std::map<std::string, CachedStatement, std::less<>>;
}  // namespace history_internal

class HistoryStore {
 public:
  struct Config {
    std::string path;                // database file; created when missing
    bool synchronous_full = true;    // false: synchronous=NORMAL (survives kill -9 only)
    absl::Duration max_age = absl::ZeroDuration();  // zero: keep forever
    int64_t max_steps_per_job = 0;                  // zero: no limit
    absl::Duration busy_timeout = absl::Seconds(5);
    Clock* clock = &RealClock();
    // Write-ahead log pages CheckpointIfDue waits for (SQLite's own default); a commit that
    // finds four times as many checkpoints itself, as SQLite would at once.
    int64_t checkpoint_pages = 1000;
  };

  struct ReadRequest {
    std::string job_id;
    int64_t since_step = 0;           // first step wanted; 0 = from the first kept
    std::vector<std::string> names;   // series to keep in each summary; empty = all
    int limit = 1000;                 // at most this many summaries (>= 1)
    bool host_detail = false;         // attach the host summaries (host order)
  };

  struct SeriesRequest {
    std::string job_id;
    std::string name;
    int64_t element = 0;              // row-major index into a non-scalar series
    int64_t from_step = 0;            // inclusive
    int64_t to_step = INT64_MAX;      // inclusive
    int max_points = 0;               // 0 = every point; otherwise >= 4
  };

  struct Point {
    int64_t step = 0;
    double value = 0;  // NaN when the step's value was NaN
  };

  struct JobInfo {
    std::string job_id;
    int64_t first_step = 0;   // oldest kept global summary; 0 when none is kept
    int64_t latest_step = 0;  // newest global summary ever appended; 0 when none
    int64_t summaries = 0;    // global summaries kept
  };

  // Errors: INVALID_ARGUMENT (empty path, null clock, negative max_age or max_steps_per_job),
  // UNAVAILABLE (the file cannot be opened or created), FAILED_PRECONDITION (the file holds a
  // newer schema), plus the common ones.
  static absl::StatusOr<std::unique_ptr<HistoryStore>> Create(Config config);
  ~HistoryStore();
  HistoryStore(const HistoryStore&) = delete;
  HistoryStore& operator=(const HistoryStore&) = delete;

  // Records a job and its declared series (so watchers may name them before the first
  // summary). Idempotent; adds series not yet known. Errors: INVALID_ARGUMENT (empty job_id or
  // series name).
  absl::Status RegisterJob(const std::string& job_id,
                           const std::vector<v1::TelemetryDeclaration>& declarations);

  // Commits one global summary: the summary without host_detail, one series point per value
  // element, and each host_detail entry as a host summary (already-stored ones are kept).
  // Registers the job and its series when new. Appending a step that is already stored
  // replaces it (idempotent for the same summary).
  // Errors: INVALID_ARGUMENT (empty job_id, step < 1).
  absl::Status Append(const v1::GlobalSummary& summary);
  // How an Append reaches the disk (with synchronous_full; without it both are kDeferred).
  enum class Durability {
    kSynced,    // fsynced before Append returns
    // Committed (visible to reads, survives kill -9) and fsynced by the next Sync() or synced
    // commit: a watcher may see the step at once, while its acknowledgements wait for Sync.
    kDeferred,
  };
  // The same with the host summaries apart (host order), so that a caller holding the summary
  // by value copies none of them (StepCombiner's sink); `global` must have no host_detail.
  // Errors: as above; INVALID_ARGUMENT when `global` has host_detail.
  absl::Status Append(const v1::GlobalSummary& global,
                      const google::protobuf::RepeatedPtrField<v1::HostSummary>& hosts,
                      Durability durability = Durability::kSynced);

  // Makes every commit so far survive power loss: fdatasyncs the write-ahead log when a
  // kDeferred commit came after the last sync (a no-op otherwise, and without
  // synchronous_full). Blocks for the disk without the store's lock, so commits go on
  // meanwhile; concurrent callers share one fdatasync. Errors: INTERNAL (the log cannot be
  // opened or synced; errno named).
  absl::Status Sync();

  // Commits one host summary (ignored when that job/step/host is already stored) and returns
  // the host's persisted_through_step: the highest step of that host committed for the job.
  // For summaries outside a combined step (late ones). Registers the job when new. Group commit: the summaries of concurrent callers go into one
  // transaction (one fsync), led by whichever caller finds none under way; each returns once
  // its own is committed. Errors: INVALID_ARGUMENT (empty job_id or host, step < 1); a failed
  // transaction's, for every summary in it.
  absl::StatusOr<int64_t> AppendHost(const v1::HostSummary& summary);

  // Global summaries of a job with step >= since_step, in step order, at most `limit`.
  // Errors: NOT_FOUND (unknown job; a name that is not a series of the job, named),
  // INVALID_ARGUMENT (since_step < 0, limit < 1, since_step beyond latest step + 1 — the
  // message names the latest step).
  absl::StatusOr<std::vector<v1::GlobalSummary>> Read(const ReadRequest& request) const;

  // The newest step appended for the job (0 when none yet). Errors: NOT_FOUND (unknown job).
  absl::StatusOr<int64_t> LatestStep(const std::string& job_id) const;

  // The series' values in [from_step, to_step], in step order. With max_points > 0 and more
  // points in range, downsamples to at most max_points: the first and the last point are kept,
  // the points between are split into (max_points - 2) / 2 buckets of consecutive points and
  // each bucket keeps its minimum and its maximum (NaN counts as the maximum), in step order.
  // Errors: NOT_FOUND (unknown job or series), INVALID_ARGUMENT (max_points 1..3 or negative,
  // from_step > to_step, element outside the series).
  absl::StatusOr<std::vector<Point>> ReadSeries(const SeriesRequest& request) const;

  // Host summaries of the job with step > after_step, in step then host order: what a
  // restarted coordinator feeds back to the StepCombiner. Errors: NOT_FOUND (unknown job).
  absl::StatusOr<std::vector<v1::HostSummary>> ReadHostSummaries(const std::string& job_id,
                                                                 int64_t after_step) const;

  // The host's persisted_through_step for the job (0 when it sent nothing).
  // Errors: NOT_FOUND (unknown job).
  absl::StatusOr<int64_t> PersistedThroughStep(const std::string& job_id,
                                               const std::string& host) const;

  // The job's declared (or first seen) series, in registration order. Errors: NOT_FOUND.
  absl::StatusOr<std::vector<v1::TelemetryDeclaration>> Series(const std::string& job_id) const;

  // Marks a job as collecting telemetry, with the owner's serialized setup, so a restarted
  // coordinator resumes it (CoordinatorTelemetry). Replaces an earlier setup.
  // Errors: INVALID_ARGUMENT (empty job_id).
  absl::Status SetCollecting(const std::string& job_id, const std::string& setup);
  // The job no longer collects (no-op when it did not).
  absl::Status ClearCollecting(const std::string& job_id);
  // Every collecting job's setup, by job_id.
  absl::StatusOr<std::map<std::string, std::string>> Collecting() const;

  // The coordinator's job table, kept across restarts: a job's serialized manifest replaces
  // the one saved before. Errors: INVALID_ARGUMENT (empty job_id), the database's.
  absl::Status SaveJob(const std::string& job_id, const std::string& manifest);
  // Every saved manifest, by job_id.
  absl::StatusOr<std::map<std::string, std::string>> SavedJobs() const;

  // Every job with history, by job_id.
  absl::StatusOr<std::vector<JobInfo>> ListJobs() const;

  // Drops what the job stored after `step` (global and host summaries, series points) and sets
  // its latest step and every host's persisted_through_step to at most `step`: the job restarted
  // from its checkpoint of `step`, and the steps after it are run again. Returns how many global
  // summaries were dropped. Errors: INVALID_ARGUMENT (step < 0), NOT_FOUND (unknown job).
  absl::StatusOr<int64_t> Rewind(const std::string& job_id, int64_t step);

  // Applies the retention limits now; returns how many global summaries were deleted.
  absl::StatusOr<int64_t> Prune();

  // Copies the write-ahead log back into the database once it holds `checkpoint_pages`. SQLite
  // would do that inside the commit that crossed the mark, and a watcher would wait for it (a
  // checkpoint writes and fsyncs the database): the owner calls this after publishing instead.
  // Errors: the database's. Implemented in history_retention.cc.
  absl::Status CheckpointIfDue();
  // Pages in the write-ahead log since its last checkpoint, as the last commit left it; what
  // the tests read to see when a checkpoint ran.
  int64_t WalPages() const;

  // Deletes everything stored for a job the coordinator forgot (a finished job past
  // --job_retention): its series, summaries, points, host progress, collecting setup and saved
  // manifest. `job_number` (the n of "job-<n>") raises HighestForgottenJob, so a restarted
  // coordinator never reuses the id. No-op for an unknown job. Implemented in
  // history_forget.cc.
  absl::Status ForgetJob(const std::string& job_id, int64_t job_number);
  // The highest job_number ForgetJob was given; 0 when none.
  absl::StatusOr<int64_t> HighestForgottenJob() const;

 private:
  explicit HistoryStore(Config config) : config_(std::move(config)) {}
  absl::Status Open();
  // sqlite3_wal_hook's callback, run by each commit with mu_ held: counts the log's pages and
  // checkpoints past four times `checkpoint_pages`.
  static int OnWalCommit(void* store, sqlite3* db, const char* schema, int pages);
  absl::Status CheckpointLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status ExecLocked(const char* sql) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status EnsureJobLocked(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status JobExistsLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // (job_id, blob) rows of `query`, by job_id.
  absl::StatusOr<std::map<std::string, std::string>> BlobsByJob(const char* query) const;
  absl::StatusOr<int64_t> LatestStepLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<std::map<std::string, int64_t>> SeriesLocked(const std::string& job_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status AddSeriesLocked(const std::string& job_id, const v1::TelemetryDeclaration& decl)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Stores a host summary; with `progress`, also raises its host's persisted step (Append
  // raises those of a whole step at once instead).
  absl::Status PutHostLocked(const v1::HostSummary& summary, int64_t host_index, bool progress)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A host summary waiting for AppendHost's group commit, on its caller's stack.
  struct HostAppend {
    const v1::HostSummary* summary;
    absl::StatusOr<int64_t> persisted = int64_t{0};
    bool done = false;
  };
  // Commits `batch` in one transaction and sets each entry's `persisted` (not `done`).
  void CommitHostsLocked(const std::vector<HostAppend*>& batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Append's transaction; `blob` is the serialized global summary.
  absl::Status AppendLocked(const v1::GlobalSummary& summary, const std::string& blob,
                            const google::protobuf::RepeatedPtrField<v1::HostSummary>& hosts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs one statement without parameters, prepared once.
  absl::Status RunCachedLocked(const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs `body` in one transaction (BEGIN IMMEDIATE ... COMMIT, ROLLBACK on error).
  absl::Status TransactionLocked(absl::FunctionRef<absl::Status()> body)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Config config_;
  mutable absl::Mutex mu_;
  sqlite3* db_ ABSL_GUARDED_BY(mu_) = nullptr;
  int64_t wal_pages_ ABSL_GUARDED_BY(mu_) = 0;
  // Statements prepared once per SQL text and reused: parsing costs more than running the
  // small statements of each append.
  history_internal::StatementCache statements_ ABSL_GUARDED_BY(mu_);
  int64_t deferred_commits_ ABSL_GUARDED_BY(mu_) = 0;  // kDeferred commits so far
  // Sync's: one fdatasync at a time, covering the deferred commits counted before it began.
  absl::Mutex sync_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  int64_t synced_commits_ ABSL_GUARDED_BY(sync_mu_) = 0;
  int wal_fd_ ABSL_GUARDED_BY(sync_mu_) = -1;  // the write-ahead log, opened by the first Sync
  // AppendHost's queue: taken before mu_, by a leader only while no commit is under way.
  absl::Mutex appends_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  std::vector<HostAppend*> appends_ ABSL_GUARDED_BY(appends_mu_);
  bool committing_ ABSL_GUARDED_BY(appends_mu_) = false;
};

}  // namespace meshrun::telemetry
