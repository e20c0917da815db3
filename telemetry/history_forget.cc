// HistoryStore::ForgetJob and HighestForgottenJob: dropping a pruned job's rows (limits:
// --job_retention, --max_finished_jobs). Split from history_store.cc, which keeps the store's
// reads, writes and retention.
#include <sqlite3.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "telemetry/history_store.h"

namespace meshrun::telemetry {
namespace {

absl::Status Failed(sqlite3* db, const std::string& what) {
  return absl::InternalError(absl::StrCat("telemetry history: ", what, ": ", sqlite3_errmsg(db)));
}

// Runs `sql` with ?1 = `text` and ?2 = `number` (when the statement has them; a statement
// naming ?2 has a slot ?1 too).
absl::Status Run(sqlite3* db, const char* sql, const std::string& text, int64_t number) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr) != SQLITE_OK) return Failed(db, sql);
  if (sqlite3_bind_parameter_count(stmt) >= 1) {
    sqlite3_bind_text(stmt, 1, text.data(), static_cast<int>(text.size()), SQLITE_TRANSIENT);
  }
  if (sqlite3_bind_parameter_count(stmt) >= 2) sqlite3_bind_int64(stmt, 2, number);
  const int rc = sqlite3_step(stmt);
  sqlite3_finalize(stmt);
  return rc == SQLITE_DONE ? absl::OkStatus() : Failed(db, sql);
}

constexpr const char* kForget[] = {
    "DELETE FROM job_series WHERE job_id = ?1",
    "DELETE FROM global_summaries WHERE job_id = ?1",
    "DELETE FROM series_points WHERE job_id = ?1",
    "DELETE FROM host_summaries WHERE job_id = ?1",
    "DELETE FROM host_progress WHERE job_id = ?1",
    "DELETE FROM collecting WHERE job_id = ?1",
    "DELETE FROM job_manifests WHERE job_id = ?1",
    "DELETE FROM jobs WHERE job_id = ?1",
    "INSERT INTO forgotten_jobs(singleton, highest) VALUES(0, ?2) ON CONFLICT(singleton) "
    "DO UPDATE SET highest = MAX(highest, excluded.highest)",
};

}  // namespace

absl::Status HistoryStore::ForgetJob(const std::string& job_id, int64_t job_number) {
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(ExecLocked("BEGIN IMMEDIATE"));
  absl::Status status = absl::OkStatus();
  for (const char* sql : kForget) {
    status = Run(db_, sql, job_id, job_number);
    if (!status.ok()) break;
  }
  if (status.ok()) return ExecLocked("COMMIT");
  (void)ExecLocked("ROLLBACK");
  return status;
}

absl::StatusOr<int64_t> HistoryStore::HighestForgottenJob() const {
  absl::MutexLock l(&mu_);
  sqlite3_stmt* stmt = nullptr;
  const char* sql = "SELECT highest FROM forgotten_jobs WHERE singleton = 0";
  if (sqlite3_prepare_v2(db_, sql, -1, &stmt, nullptr) != SQLITE_OK) return Failed(db_, sql);
  const int rc = sqlite3_step(stmt);
  const int64_t highest = rc == SQLITE_ROW ? sqlite3_column_int64(stmt, 0) : 0;
  sqlite3_finalize(stmt);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE) return Failed(db_, sql);
  return highest;
}

}  // namespace meshrun::telemetry
