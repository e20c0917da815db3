// HistoryStore::ForgetJob and HighestForgottenJob: dropping a pruned job's rows (limits:
// --job_retention, --max_finished_jobs). The store's writes and retention are in
// history_store.cc, its reads in history_read.cc.
#include "common/status_macros.h"
#include "telemetry/history_sqlite.h"
#include "telemetry/history_store.h"

namespace meshrun::telemetry {
namespace {

using history_internal::Stmt;

// ?1: the job id.
constexpr const char* kDeleteJob[] = {
    "DELETE FROM job_series WHERE job_id = ?1",
    "DELETE FROM global_summaries WHERE job_id = ?1",
    "DELETE FROM series_points WHERE job_id = ?1",
    "DELETE FROM host_summaries WHERE job_id = ?1",
    "DELETE FROM host_progress WHERE job_id = ?1",
    "DELETE FROM collecting WHERE job_id = ?1",
    "DELETE FROM job_manifests WHERE job_id = ?1",
    "DELETE FROM jobs WHERE job_id = ?1",
};
// ?1: the job's number.
constexpr const char* kRaiseHighest =
    "INSERT INTO forgotten_jobs(singleton, highest) VALUES(0, ?1) ON CONFLICT(singleton) "
    "DO UPDATE SET highest = MAX(highest, excluded.highest)";

template <typename Value>
absl::Status Run(sqlite3* db, const char* sql, const Value& value) {
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db, sql));
  return stmt.Bind(1, value).Run();
}

}  // namespace

absl::Status HistoryStore::ForgetJob(const std::string& job_id, int64_t job_number) {
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
  absl::Status status;
  for (const char* sql : kDeleteJob) {
    status = Run(db_, sql, job_id);
    if (!status.ok()) break;
  }
  if (status.ok()) status = Run(db_, kRaiseHighest, job_number);
  if (status.ok()) return ExecLocked("COMMIT");
  (void)ExecLocked("ROLLBACK");
  return status;
}

absl::StatusOr<int64_t> HistoryStore::HighestForgottenJob() const {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(Stmt stmt,
                   Stmt::Prepare(db_, "SELECT highest FROM forgotten_jobs WHERE singleton = 0"));
  ASSIGN_OR_RETURN(bool row, stmt.Step());
  return row ? stmt.Int(0) : 0;
}

}  // namespace meshrun::telemetry
