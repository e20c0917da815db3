#include "telemetry/history_store.h"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sqlite3.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/file_sync.h"
#include "common/status_macros.h"
#include "telemetry/history_sqlite.h"

namespace meshrun::telemetry {

namespace {

using history_internal::ParseRows;
using history_internal::SqliteError;
using history_internal::Stmt;

// 2: series_points step-major (version 1 kept each element's points together).
constexpr int kSchemaVersion = 2;
// host_index of a host summary known only from AppendHost (its order is not known yet).
constexpr int64_t kUnknownHostIndex = std::numeric_limits<int32_t>::max();

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS jobs(
  job_id TEXT PRIMARY KEY,
  created_micros INTEGER NOT NULL,
  latest_step INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS job_series(
  job_id TEXT NOT NULL,
  name TEXT NOT NULL,
  elements INTEGER NOT NULL,
  declaration BLOB NOT NULL,
  UNIQUE(job_id, name));
CREATE TABLE IF NOT EXISTS global_summaries(
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  inserted_micros INTEGER NOT NULL,
  summary BLOB NOT NULL,
  PRIMARY KEY(job_id, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS series_points(
  job_id TEXT NOT NULL,
  name TEXT NOT NULL,
  element INTEGER NOT NULL,
  step INTEGER NOT NULL,
  value REAL,
  PRIMARY KEY(job_id, step, name, element)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS host_summaries(
  job_id TEXT NOT NULL,
  step INTEGER NOT NULL,
  host TEXT NOT NULL,
  host_index INTEGER NOT NULL,
  inserted_micros INTEGER NOT NULL,
  summary BLOB NOT NULL,
  PRIMARY KEY(job_id, step, host)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS host_progress(
  job_id TEXT NOT NULL,
  host TEXT NOT NULL,
  persisted_through_step INTEGER NOT NULL,
  PRIMARY KEY(job_id, host)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS collecting(
  job_id TEXT PRIMARY KEY,
  setup BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS job_manifests(
  job_id TEXT PRIMARY KEY,
  manifest BLOB NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS forgotten_jobs(
  singleton INTEGER PRIMARY KEY CHECK(singleton = 0),
  highest INTEGER NOT NULL);
)sql";

// Version 1 to 2, around kSchema (which creates the step-major series_points): the old table
// is set aside before, its rows moved after. One transaction, so a crash leaves version 1.
constexpr const char* kSetAsideElementMajorPoints =
    "ALTER TABLE series_points RENAME TO series_points_element_major";
constexpr const char* kMoveElementMajorPoints = R"sql(
INSERT INTO series_points(job_id, name, element, step, value)
  SELECT job_id, name, element, step, value FROM series_points_element_major;
DROP TABLE series_points_element_major;
)sql";

int64_t Elements(const v1::TelemetryDeclaration& decl) {
  int64_t elements = 1;
  for (int64_t dim : decl.shape()) elements *= std::max<int64_t>(dim, 0);
  return elements;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HistoryStore>> HistoryStore::Create(Config config) {
  if (config.path.empty()) return absl::InvalidArgumentError("HistoryStore: path is empty");
  if (config.clock == nullptr) return absl::InvalidArgumentError("HistoryStore: clock is null");
  if (config.max_age < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("HistoryStore: max_age is negative");
  }
  if (config.max_steps_per_job < 0) {
    return absl::InvalidArgumentError("HistoryStore: max_steps_per_job is negative");
  }
  if (config.checkpoint_pages < 1) {
    return absl::InvalidArgumentError("HistoryStore: checkpoint_pages must be at least 1");
  }
  std::unique_ptr<HistoryStore> store(new HistoryStore(std::move(config)));
  RETURN_IF_ERROR(store->Open());
  return store;
}

HistoryStore::~HistoryStore() {
  {
    absl::MutexLock sync(&sync_mu_);
    if (wal_fd_ >= 0) ::close(wal_fd_);
  }
  absl::MutexLock l(&mu_);
  for (auto& [sql, cached] : statements_) sqlite3_finalize(cached.stmt);
  if (db_ != nullptr) sqlite3_close_v2(db_);
}

absl::Status HistoryStore::ExecLocked(const char* sql) const {
  char* error = nullptr;
  const int rc = sqlite3_exec(db_, sql, nullptr, nullptr, &error);
  if (rc != SQLITE_OK) {
    absl::Status status = SqliteError(db_, rc, sql);
    sqlite3_free(error);
    return status;
  }
  return absl::OkStatus();
}

absl::Status HistoryStore::Open() {
  absl::MutexLock l(&mu_);
  const int rc = sqlite3_open_v2(config_.path.c_str(), &db_,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    absl::Status status = absl::UnavailableError(
        absl::StrCat("telemetry history: cannot open ", config_.path, ": ",
                     db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc)));
    sqlite3_close_v2(db_);
    db_ = nullptr;
    return status;
  }
  sqlite3_busy_timeout(db_, static_cast<int>(absl::ToInt64Milliseconds(config_.busy_timeout)));
  {
    ASSIGN_OR_RETURN(Stmt wal, Stmt::Prepare(db_, "PRAGMA journal_mode=WAL"));
    ASSIGN_OR_RETURN(bool row, wal.Step());
    if (!row || wal.Text(0) != "wal") {
      return absl::InternalError(absl::StrCat("telemetry history: ", config_.path,
                                              " cannot use the WAL journal"));
    }
  }
  RETURN_IF_ERROR(ExecLocked(config_.synchronous_full ? "PRAGMA synchronous=FULL"
                                                      : "PRAGMA synchronous=NORMAL"));
  sqlite3_wal_hook(db_, &HistoryStore::OnWalCommit, this);  // replaces SQLite's checkpoints
  int64_t version = 0;
  {
    ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "PRAGMA user_version"));
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (row) version = stmt.Int(0);
  }
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat("telemetry history ", config_.path, " has schema version ", version,
                     "; this build reads up to ", kSchemaVersion));
  }
  const absl::Time start = absl::Now();
  if (version == 1) {
    spdlog::info("telemetry history {}: moving its series points to schema 2's step-major "
                 "layout, once (about 3 s a million points)",
                 config_.path);
  }
  RETURN_IF_ERROR(TransactionLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    if (version == 1) RETURN_IF_ERROR(ExecLocked(kSetAsideElementMajorPoints));
    RETURN_IF_ERROR(ExecLocked(kSchema));
    if (version == 1) RETURN_IF_ERROR(ExecLocked(kMoveElementMajorPoints));
    return ExecLocked("PRAGMA user_version=2");
  }));
  if (version == 1) {
    spdlog::info("telemetry history {}: series points moved in {:.1f} s", config_.path,
                 absl::ToDoubleSeconds(absl::Now() - start));
  }
  return absl::OkStatus();
}

absl::Status HistoryStore::TransactionLocked(absl::FunctionRef<absl::Status()> body) {
  RETURN_IF_ERROR(RunCachedLocked("BEGIN IMMEDIATE"));
  absl::Status status = body();
  if (status.ok()) status = RunCachedLocked("COMMIT");
  if (!status.ok() && !sqlite3_get_autocommit(db_)) {
    (void)RunCachedLocked("ROLLBACK");
  }
  return status;
}

absl::Status HistoryStore::EnsureJobLocked(const std::string& job_id) {
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Cached(db_, statements_,
                                           "INSERT OR IGNORE INTO jobs(job_id, created_micros) "
                                           "VALUES(?1, ?2)"));
  return stmt.Bind(1, job_id).Bind(2, absl::ToUnixMicros(config_.clock->Now())).Run();
}

absl::Status HistoryStore::JobExistsLocked(const std::string& job_id) const {
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT 1 FROM jobs WHERE job_id = ?1"));
  ASSIGN_OR_RETURN(bool row, stmt.Bind(1, job_id).Step());
  if (!row) {
    return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" has no telemetry history"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> HistoryStore::LatestStepLocked(const std::string& job_id) const {
  ASSIGN_OR_RETURN(Stmt stmt,
                   Stmt::Prepare(db_, "SELECT latest_step FROM jobs WHERE job_id = ?1"));
  ASSIGN_OR_RETURN(bool row, stmt.Bind(1, job_id).Step());
  if (!row) {
    return absl::NotFoundError(absl::StrCat("job \"", job_id, "\" has no telemetry history"));
  }
  return stmt.Int(0);
}

absl::StatusOr<std::map<std::string, int64_t>> HistoryStore::SeriesLocked(
    const std::string& job_id) const {
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT name, elements FROM job_series "
                                                 "WHERE job_id = ?1"));
  stmt.Bind(1, job_id);
  std::map<std::string, int64_t> series;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    series[stmt.Text(0)] = stmt.Int(1);
  }
  return series;
}

absl::Status HistoryStore::AddSeriesLocked(const std::string& job_id,
                                           const v1::TelemetryDeclaration& decl) {
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Cached(db_, statements_,
                                           "INSERT OR IGNORE INTO job_series(job_id, "
                                           "name, elements, declaration) "
                                           "VALUES(?1, ?2, ?3, ?4)"));
  return stmt.Bind(1, job_id)
      .Bind(2, decl.name())
      .Bind(3, Elements(decl))
      .BindBlob(4, decl.SerializeAsString())
      .Run();
}

absl::Status HistoryStore::PutHostLocked(const v1::HostSummary& summary, int64_t host_index,
                                         bool progress) {
  ASSIGN_OR_RETURN(
      Stmt stmt,
      Stmt::Cached(db_, statements_,
                   "INSERT INTO host_summaries(job_id, step, host, host_index, "
                   "inserted_micros, summary) VALUES(?1, ?2, ?3, ?4, ?5, ?6) "
                   "ON CONFLICT(job_id, step, host) DO UPDATE SET "
                   "host_index = MIN(host_index, excluded.host_index)"));
  RETURN_IF_ERROR(stmt.Bind(1, summary.job_id())
                      .Bind(2, summary.step())
                      .Bind(3, summary.host())
                      .Bind(4, host_index)
                      .Bind(5, absl::ToUnixMicros(config_.clock->Now()))
                      .BindBlob(6, summary.SerializeAsString())
                      .Run());
  if (!progress) return absl::OkStatus();
  ASSIGN_OR_RETURN(
      Stmt persisted,
      Stmt::Cached(db_, statements_,
                   "INSERT INTO host_progress(job_id, host, persisted_through_step) "
                   "VALUES(?1, ?2, ?3) ON CONFLICT(job_id, host) DO UPDATE SET "
                   "persisted_through_step = MAX(persisted_through_step, "
                   "excluded.persisted_through_step)"));
  return persisted.Bind(1, summary.job_id()).Bind(2, summary.host()).Bind(3, summary.step())
      .Run();
}

absl::Status HistoryStore::RegisterJob(const std::string& job_id,
                                       const std::vector<v1::TelemetryDeclaration>& declarations) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  for (size_t i = 0; i < declarations.size(); ++i) {
    if (declarations[i].name().empty()) {
      return absl::InvalidArgumentError(absl::StrCat("telemetry[", i, "].name is empty"));
    }
  }
  absl::MutexLock l(&mu_);
  return TransactionLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    RETURN_IF_ERROR(EnsureJobLocked(job_id));
    for (const v1::TelemetryDeclaration& decl : declarations) {
      RETURN_IF_ERROR(AddSeriesLocked(job_id, decl));
    }
    return absl::OkStatus();
  });
}

absl::Status HistoryStore::Append(const v1::GlobalSummary& summary) {
  if (summary.host_detail_size() == 0) return Append(summary, summary.host_detail());
  v1::GlobalSummary global = summary;
  google::protobuf::RepeatedPtrField<v1::HostSummary> hosts;
  hosts.Swap(global.mutable_host_detail());
  return Append(global, hosts);
}

absl::Status HistoryStore::Append(
    const v1::GlobalSummary& summary,
    const google::protobuf::RepeatedPtrField<v1::HostSummary>& hosts, Durability durability) {
  if (summary.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
  if (summary.step() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("step ", summary.step(), " of job ",
                                                   summary.job_id(), " must be >= 1"));
  }
  if (summary.host_detail_size() > 0) {
    return absl::InvalidArgumentError("the global summary carries host_detail: pass it apart");
  }
  const std::string blob = summary.SerializeAsString();
  absl::MutexLock l(&mu_);
  const bool deferred = durability == Durability::kDeferred && config_.synchronous_full;
  // synchronous is the connection's: NORMAL for this one commit (it writes the log without
  // fsyncing it), FULL again for every other.
  if (deferred) RETURN_IF_ERROR(RunCachedLocked("PRAGMA synchronous=NORMAL"));
  absl::Status committed = AppendLocked(summary, blob, hosts);
  if (deferred) {
    if (committed.ok()) ++deferred_commits_;
    if (absl::Status full = RunCachedLocked("PRAGMA synchronous=FULL"); !full.ok()) return full;
  }
  return committed;
}

absl::Status HistoryStore::RunCachedLocked(const char* sql) {
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Cached(db_, statements_, sql));
  return stmt.Run();
}

absl::Status HistoryStore::Sync() {
  if (!config_.synchronous_full) return absl::OkStatus();
  absl::MutexLock sync(&sync_mu_);
  int64_t covered = 0;  // every deferred commit by now: their frames are written
  {
    absl::MutexLock l(&mu_);
    covered = deferred_commits_;
  }
  // A caller that waited here for the sync before it usually finds its commits covered.
  if (synced_commits_ >= covered) return absl::OkStatus();
  if (wal_fd_ < 0) {
    const std::string wal = config_.path + "-wal";
    wal_fd_ = ::open(wal.c_str(), O_RDONLY | O_CLOEXEC);
    if (wal_fd_ < 0) {
      return absl::InternalError(absl::StrCat("telemetry history: cannot open ", wal,
                                              " to sync it: ", std::strerror(errno)));
    }
    // A log that no synced commit wrote yet may be new: its name must survive too.
    const std::string dir = std::filesystem::path(config_.path).parent_path().string();
    if (const int e = FsyncDirectory(dir.empty() ? "." : dir); e != 0) {
      return absl::InternalError(absl::StrCat("telemetry history: cannot sync directory ", dir,
                                              ": ", std::strerror(e)));
    }
  }
  if (::fdatasync(wal_fd_) != 0) {
    return absl::InternalError(absl::StrCat("telemetry history: cannot sync ", config_.path,
                                            "-wal: ", std::strerror(errno)));
  }
  synced_commits_ = covered;
  return absl::OkStatus();
}

absl::Status HistoryStore::AppendLocked(
    const v1::GlobalSummary& summary, const std::string& blob,
    const google::protobuf::RepeatedPtrField<v1::HostSummary>& hosts) {
  return TransactionLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    RETURN_IF_ERROR(EnsureJobLocked(summary.job_id()));
    {
      ASSIGN_OR_RETURN(Stmt stmt,
                       Stmt::Cached(db_, statements_,
                                    "INSERT OR REPLACE INTO global_summaries(job_id, step, "
                                    "inserted_micros, summary) VALUES(?1, ?2, ?3, ?4)"));
      RETURN_IF_ERROR(stmt.Bind(1, summary.job_id())
                          .Bind(2, summary.step())
                          .Bind(3, absl::ToUnixMicros(config_.clock->Now()))
                          .BindBlob(4, blob)
                          .Run());
    }
    {
      ASSIGN_OR_RETURN(Stmt stmt, Stmt::Cached(db_, statements_,
                                               "UPDATE jobs SET latest_step = "
                                               "MAX(latest_step, ?2) WHERE job_id = ?1"));
      RETURN_IF_ERROR(stmt.Bind(1, summary.job_id()).Bind(2, summary.step()).Run());
    }
    ASSIGN_OR_RETURN(Stmt point,
                     Stmt::Cached(db_, statements_,
                                  "INSERT OR REPLACE INTO series_points(job_id, name, "
                                  "element, step, value) VALUES(?1, ?2, ?3, ?4, ?5)"));
    for (const v1::TelemetryValue& value : summary.values()) {
      v1::TelemetryDeclaration decl;
      decl.set_name(value.name());
      *decl.mutable_shape() = value.shape();
      RETURN_IF_ERROR(AddSeriesLocked(summary.job_id(), decl));
      for (int e = 0; e < value.values_size(); ++e) {
        point.Reset();
        RETURN_IF_ERROR(point.Bind(1, summary.job_id())
                            .Bind(2, value.name())
                            .Bind(3, e)
                            .Bind(4, summary.step())
                            .BindReal(5, value.values(e))
                            .Run());
      }
    }
    for (int h = 0; h < hosts.size(); ++h) {
      RETURN_IF_ERROR(PutHostLocked(hosts.Get(h), h, /*progress=*/false));
    }
    // Every host of the step has persisted through it: one statement for them all, not one a
    // host (at a thousand hosts, a fifth of a step's commit).
    ASSIGN_OR_RETURN(
        Stmt progress,
        Stmt::Cached(db_, statements_,
                     "INSERT INTO host_progress(job_id, host, persisted_through_step) "
                     "SELECT job_id, host, step FROM host_summaries WHERE job_id = ?1 AND "
                     "step = ?2 ON CONFLICT(job_id, host) DO UPDATE SET persisted_through_step = "
                     "MAX(persisted_through_step, excluded.persisted_through_step)"));
    return progress.Bind(1, summary.job_id()).Bind(2, summary.step()).Run();
  });
}

absl::StatusOr<int64_t> HistoryStore::AppendHost(const v1::HostSummary& summary) {
  if (summary.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
  if (summary.host().empty()) return absl::InvalidArgumentError("host is empty");
  if (summary.step() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("step ", summary.step(), " of job ",
                                                   summary.job_id(), " must be >= 1"));
  }
  HostAppend mine{.summary = &summary};
  absl::MutexLock queue(&appends_mu_);
  appends_.push_back(&mine);
  while (true) {
    auto done_or_free = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(appends_mu_) {
      return mine.done || !committing_;
    };
    appends_mu_.Await(absl::Condition(&done_or_free));
    if (mine.done) return mine.persisted;
    // No commit under way: this caller commits everything queued, its own summary included.
    committing_ = true;
    std::vector<HostAppend*> batch;
    batch.swap(appends_);
    appends_mu_.Unlock();
    {
      absl::MutexLock l(&mu_);
      CommitHostsLocked(batch);
    }
    appends_mu_.Lock();
    for (HostAppend* append : batch) append->done = true;
    committing_ = false;
  }
}

void HistoryStore::CommitHostsLocked(const std::vector<HostAppend*>& batch) {
  absl::Status committed = TransactionLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (HostAppend* append : batch) {
      const v1::HostSummary& summary = *append->summary;
      RETURN_IF_ERROR(EnsureJobLocked(summary.job_id()));
      {
        ASSIGN_OR_RETURN(
            Stmt stmt,
            Stmt::Cached(db_, statements_,
                         "SELECT 1 FROM host_summaries WHERE job_id = ?1 AND step = ?2 "
                         "AND host = ?3"));
        ASSIGN_OR_RETURN(bool exists,
                         stmt.Bind(1, summary.job_id()).Bind(2, summary.step())
                             .Bind(3, summary.host()).Step());
        if (!exists) RETURN_IF_ERROR(PutHostLocked(summary, kUnknownHostIndex, true));
      }
      ASSIGN_OR_RETURN(Stmt stmt, Stmt::Cached(db_, statements_,
                                               "SELECT persisted_through_step FROM "
                                               "host_progress WHERE job_id = ?1 AND "
                                               "host = ?2"));
      ASSIGN_OR_RETURN(bool row, stmt.Bind(1, summary.job_id()).Bind(2, summary.host()).Step());
      append->persisted = row ? stmt.Int(0) : summary.step();
    }
    return absl::OkStatus();
  });
  if (!committed.ok()) {
    for (HostAppend* append : batch) append->persisted = committed;
  }
}

absl::StatusOr<int64_t> HistoryStore::LatestStep(const std::string& job_id) const {
  absl::MutexLock l(&mu_);
  return LatestStepLocked(job_id);
}

absl::StatusOr<int64_t> HistoryStore::PersistedThroughStep(const std::string& job_id,
                                                           const std::string& host) const {
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(JobExistsLocked(job_id));
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT persisted_through_step FROM "
                                                 "host_progress WHERE job_id = ?1 AND host = ?2"));
  ASSIGN_OR_RETURN(bool row, stmt.Bind(1, job_id).Bind(2, host).Step());
  return row ? stmt.Int(0) : 0;
}

absl::Status HistoryStore::SetCollecting(const std::string& job_id, const std::string& setup) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "INSERT OR REPLACE INTO collecting(job_id, "
                                                 "setup) VALUES (?1, ?2)"));
  return stmt.Bind(1, job_id).BindBlob(2, setup).Run();
}

absl::Status HistoryStore::ClearCollecting(const std::string& job_id) {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "DELETE FROM collecting WHERE job_id = ?1"));
  return stmt.Bind(1, job_id).Run();
}

absl::StatusOr<std::map<std::string, std::string>> HistoryStore::Collecting() const {
  return BlobsByJob("SELECT job_id, setup FROM collecting");
}

absl::Status HistoryStore::SaveJob(const std::string& job_id, const std::string& manifest) {
  if (job_id.empty()) return absl::InvalidArgumentError("job_id is empty");
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "INSERT OR REPLACE INTO job_manifests(job_id, "
                                                 "manifest) VALUES (?1, ?2)"));
  return stmt.Bind(1, job_id).BindBlob(2, manifest).Run();
}

absl::StatusOr<std::map<std::string, std::string>> HistoryStore::SavedJobs() const {
  return BlobsByJob("SELECT job_id, manifest FROM job_manifests");
}

absl::StatusOr<std::map<std::string, std::string>> HistoryStore::BlobsByJob(
    const char* query) const {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, query));
  std::map<std::string, std::string> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    const char* blob = static_cast<const char*>(stmt.Blob(1));
    out[stmt.Text(0)] = blob == nullptr ? "" : std::string(blob, stmt.Bytes(1));
  }
  return out;
}

absl::StatusOr<std::vector<v1::TelemetryDeclaration>> HistoryStore::Series(
    const std::string& job_id) const {
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(JobExistsLocked(job_id));
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT declaration FROM job_series WHERE "
                                                 "job_id = ?1 ORDER BY rowid"));
  stmt.Bind(1, job_id);
  return ParseRows<v1::TelemetryDeclaration>(stmt, "series declaration");
}

absl::StatusOr<std::vector<HistoryStore::JobInfo>> HistoryStore::ListJobs() const {
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(
      Stmt stmt,
      Stmt::Prepare(db_, "SELECT j.job_id, j.latest_step, "
                         "(SELECT MIN(step) FROM global_summaries g WHERE g.job_id = j.job_id), "
                         "(SELECT COUNT(*) FROM global_summaries g WHERE g.job_id = j.job_id) "
                         "FROM jobs j ORDER BY j.job_id"));
  std::vector<JobInfo> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    out.push_back(JobInfo{stmt.Text(0), stmt.Int(2), stmt.Int(1), stmt.Int(3)});
  }
  return out;
}

}  // namespace meshrun::telemetry
