// HistoryStore's retention: Rewind (a job restarted from a checkpoint), Prune (by age and by
// steps per job) and the write-ahead log's checkpoints. Declared in history_store.h.
#include <sqlite3.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "telemetry/history_sqlite.h"
#include "telemetry/history_store.h"

namespace meshrun::telemetry {

using history_internal::SqliteError;
using history_internal::Stmt;

absl::StatusOr<int64_t> HistoryStore::Rewind(const std::string& job_id, int64_t step) {
  if (step < 0) return absl::InvalidArgumentError("Rewind: step is negative");
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(JobExistsLocked(job_id));
  int64_t dropped = 0;
  RETURN_IF_ERROR(TransactionLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    bool first = true;  // the global summaries: their count is returned
    for (const char* sql : {"DELETE FROM global_summaries WHERE job_id = ?1 AND step > ?2",
                            "DELETE FROM series_points WHERE job_id = ?1 AND step > ?2",
                            "DELETE FROM host_summaries WHERE job_id = ?1 AND step > ?2",
                            "UPDATE jobs SET latest_step = ?2 WHERE job_id = ?1 AND "
                            "latest_step > ?2",
                            "UPDATE host_progress SET persisted_through_step = ?2 WHERE "
                            "job_id = ?1 AND persisted_through_step > ?2"}) {
      ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, sql));
      RETURN_IF_ERROR(stmt.Bind(1, job_id).Bind(2, step).Run());
      if (first) dropped = sqlite3_changes(db_);
      first = false;
    }
    return absl::OkStatus();
  }));
  return dropped;
}

absl::StatusOr<int64_t> HistoryStore::Prune() {
  absl::MutexLock l(&mu_);
  int64_t deleted = 0;
  const bool by_age = config_.max_age > absl::ZeroDuration();
  const bool by_count = config_.max_steps_per_job > 0;
  if (!by_age && !by_count) return 0;
  const int64_t cutoff = absl::ToUnixMicros(config_.clock->Now() - config_.max_age);
  RETURN_IF_ERROR(TransactionLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    std::vector<std::string> jobs;
    {
      ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT job_id FROM jobs"));
      while (true) {
        ASSIGN_OR_RETURN(bool row, stmt.Step());
        if (!row) break;
        jobs.push_back(stmt.Text(0));
      }
    }
    for (const std::string& job_id : jobs) {
      // Every step below `keep_from` goes.
      int64_t keep_from = 0;
      if (by_age) {
        ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT MAX(step) FROM global_summaries "
                                                       "WHERE job_id = ?1 AND "
                                                       "inserted_micros < ?2"));
        ASSIGN_OR_RETURN(bool row, stmt.Bind(1, job_id).Bind(2, cutoff).Step());
        if (row && !stmt.IsNull(0)) keep_from = std::max(keep_from, stmt.Int(0) + 1);
      }
      if (by_count) {
        ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT step FROM global_summaries "
                                                       "WHERE job_id = ?1 ORDER BY step DESC "
                                                       "LIMIT 1 OFFSET ?2"));
        ASSIGN_OR_RETURN(bool row,
                         stmt.Bind(1, job_id).Bind(2, config_.max_steps_per_job - 1).Step());
        if (row) keep_from = std::max(keep_from, stmt.Int(0));
      }
      if (keep_from > 0) {
        {
          ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "DELETE FROM global_summaries WHERE "
                                                         "job_id = ?1 AND step < ?2"));
          RETURN_IF_ERROR(stmt.Bind(1, job_id).Bind(2, keep_from).Run());
          deleted += sqlite3_changes(db_);
        }
        {
          ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "DELETE FROM series_points WHERE "
                                                         "job_id = ?1 AND step < ?2"));
          RETURN_IF_ERROR(stmt.Bind(1, job_id).Bind(2, keep_from).Run());
        }
        ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "DELETE FROM host_summaries WHERE "
                                                       "job_id = ?1 AND step < ?2"));
        RETURN_IF_ERROR(stmt.Bind(1, job_id).Bind(2, keep_from).Run());
      }
    }
    if (by_age) {
      // Host summaries that never became part of a kept global summary, and jobs left empty.
      {
        ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "DELETE FROM host_summaries WHERE "
                                                       "inserted_micros < ?1"));
        RETURN_IF_ERROR(stmt.Bind(1, cutoff).Run());
      }
      std::vector<std::string> empty;
      {
        ASSIGN_OR_RETURN(
            Stmt stmt,
            Stmt::Prepare(db_, "SELECT job_id FROM jobs j WHERE created_micros < ?1 AND "
                               "NOT EXISTS (SELECT 1 FROM global_summaries g "
                               "WHERE g.job_id = j.job_id) AND "
                               "NOT EXISTS (SELECT 1 FROM host_summaries h "
                               "WHERE h.job_id = j.job_id)"));
        stmt.Bind(1, cutoff);
        while (true) {
          ASSIGN_OR_RETURN(bool row, stmt.Step());
          if (!row) break;
          empty.push_back(stmt.Text(0));
        }
      }
      for (const std::string& job_id : empty) {
        for (const char* sql : {"DELETE FROM jobs WHERE job_id = ?1",
                                "DELETE FROM job_series WHERE job_id = ?1",
                                "DELETE FROM host_progress WHERE job_id = ?1",
                                "DELETE FROM series_points WHERE job_id = ?1"}) {
          ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, sql));
          RETURN_IF_ERROR(stmt.Bind(1, job_id).Run());
        }
      }
    }
    return absl::OkStatus();
  }));
  return deleted;
}

int HistoryStore::OnWalCommit(void* store, sqlite3*, const char*, int pages) {
  auto* self = static_cast<HistoryStore*>(store);
  self->mu_.AssertHeld();  // commits run under mu_
  self->wal_pages_ = pages;
  if (self->wal_pages_ >= 4 * self->config_.checkpoint_pages) {
    // Nobody called CheckpointIfDue (writes that publish nothing): keep the log bounded. The
    // commit stands either way; a checkpoint that failed is tried again by the next one.
    self->CheckpointLocked().IgnoreError();
  }
  return SQLITE_OK;
}

absl::Status HistoryStore::CheckpointLocked() {
  // PASSIVE: this connection is the only writer and reader, so it copies the whole log.
  const int rc =
      sqlite3_wal_checkpoint_v2(db_, nullptr, SQLITE_CHECKPOINT_PASSIVE, nullptr, nullptr);
  if (rc != SQLITE_OK) return SqliteError(db_, rc, "checkpoint of the write-ahead log");
  wal_pages_ = 0;
  return absl::OkStatus();
}

absl::Status HistoryStore::CheckpointIfDue() {
  absl::MutexLock l(&mu_);
  if (wal_pages_ < config_.checkpoint_pages) return absl::OkStatus();
  return CheckpointLocked();
}

int64_t HistoryStore::WalPages() const {
  absl::MutexLock l(&mu_);
  return wal_pages_;
}

}  // namespace meshrun::telemetry
