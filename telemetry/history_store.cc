#include "telemetry/history_store.h"

#include <sqlite3.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace meshrun::telemetry {

void FilterValues(const std::set<std::string>& names,
                  google::protobuf::RepeatedPtrField<v1::TelemetryValue>& values) {
  if (names.empty()) return;
  values.erase(std::remove_if(values.begin(), values.end(),
                              [&](const v1::TelemetryValue& value) {
                                return names.count(value.name()) == 0;
                              }),
               values.end());
}

namespace {

constexpr int kSchemaVersion = 1;
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
  PRIMARY KEY(job_id, name, element, step)) WITHOUT ROWID;
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

absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what) {
  const std::string message =
      absl::StrCat("telemetry history: ", what, ": ", db != nullptr ? sqlite3_errmsg(db) : "",
                   " (", sqlite3_errstr(rc), ")");
  switch (rc & 0xff) {
    case SQLITE_CORRUPT:
    case SQLITE_NOTADB: return absl::DataLossError(message);
    case SQLITE_FULL: return absl::ResourceExhaustedError(message);
    case SQLITE_CANTOPEN: return absl::UnavailableError(message);
    default: return absl::InternalError(message);
  }
}

using history_internal::CachedStatement;

// One prepared statement: its own (finalized on destruction), or borrowed from the store's
// cache (reset and given back on destruction).
class Stmt {
 public:
  static absl::StatusOr<Stmt> Prepare(sqlite3* db, const char* sql) {
    sqlite3_stmt* stmt = nullptr;
    const int rc = sqlite3_prepare_v2(db, sql, -1, &stmt, nullptr);
    if (rc != SQLITE_OK) return SqliteError(db, rc, absl::StrCat("prepare \"", sql, "\""));
    return Stmt(db, stmt);
  }
  // The cached statement of `sql`, prepared on first use; its own one while the cached one
  // is held by another Stmt.
  static absl::StatusOr<Stmt> Cached(sqlite3* db, std::map<std::string, CachedStatement>& cache,
                                     const char* sql) {
    CachedStatement& entry = cache[sql];
    if (entry.in_use) return Prepare(db, sql);
    if (entry.stmt == nullptr) {
      const int rc =
          sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &entry.stmt, nullptr);
      if (rc != SQLITE_OK) {
        cache.erase(sql);
        return SqliteError(db, rc, absl::StrCat("prepare \"", sql, "\""));
      }
    }
    entry.in_use = true;
    Stmt stmt(db, entry.stmt);
    stmt.cached_ = &entry;
    return stmt;
  }
  Stmt(Stmt&& other) noexcept : db_(other.db_), stmt_(std::exchange(other.stmt_, nullptr)),
                                cached_(std::exchange(other.cached_, nullptr)),
                                bind_rc_(other.bind_rc_) {}
  Stmt& operator=(Stmt&&) = delete;
  ~Stmt() {
    if (stmt_ == nullptr) return;
    if (cached_ == nullptr) {
      sqlite3_finalize(stmt_);
      return;
    }
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    cached_->in_use = false;
  }

  Stmt& Bind(int index, int64_t value) {
    Check(sqlite3_bind_int64(stmt_, index, value));
    return *this;
  }
  Stmt& Bind(int index, const std::string& value) {
    Check(sqlite3_bind_text(stmt_, index, value.data(), static_cast<int>(value.size()),
                            SQLITE_TRANSIENT));
    return *this;
  }
  Stmt& BindBlob(int index, const std::string& value) {
    Check(sqlite3_bind_blob(stmt_, index, value.data(), static_cast<int>(value.size()),
                            SQLITE_TRANSIENT));
    return *this;
  }
  // NaN is stored as NULL (SQLite has no NaN).
  Stmt& BindReal(int index, double value) {
    Check(std::isnan(value) ? sqlite3_bind_null(stmt_, index)
                            : sqlite3_bind_double(stmt_, index, value));
    return *this;
  }

  // True when a row is available, false when done.
  absl::StatusOr<bool> Step() {
    if (bind_rc_ != SQLITE_OK) return SqliteError(db_, bind_rc_, "bind");
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return SqliteError(db_, rc, absl::StrCat("step \"", sqlite3_sql(stmt_), "\""));
  }
  absl::Status Run() {
    ASSIGN_OR_RETURN(bool row, Step());
    (void)row;
    return absl::OkStatus();
  }

  void Reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
    bind_rc_ = SQLITE_OK;
  }

  bool IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  int64_t Int(int col) const { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const {
    return sqlite3_column_type(stmt_, col) == SQLITE_NULL
               ? std::numeric_limits<double>::quiet_NaN()
               : sqlite3_column_double(stmt_, col);
  }
  std::string Text(int col) const {
    const unsigned char* text = sqlite3_column_text(stmt_, col);
    return text == nullptr ? std::string()
                           : std::string(reinterpret_cast<const char*>(text),
                                         static_cast<size_t>(sqlite3_column_bytes(stmt_, col)));
  }
  const void* Blob(int col) const { return sqlite3_column_blob(stmt_, col); }
  int Bytes(int col) const { return sqlite3_column_bytes(stmt_, col); }

 private:
  Stmt(sqlite3* db, sqlite3_stmt* stmt) : db_(db), stmt_(stmt) {}
  void Check(int rc) {
    if (rc != SQLITE_OK && bind_rc_ == SQLITE_OK) bind_rc_ = rc;
  }

  sqlite3* db_;
  sqlite3_stmt* stmt_;
  CachedStatement* cached_ = nullptr;
  int bind_rc_ = SQLITE_OK;
};

template <typename Message>
absl::Status ParseRow(const Stmt& stmt, int col, Message& out, absl::string_view what) {
  if (!out.ParseFromArray(stmt.Blob(col), stmt.Bytes(col))) {
    return absl::DataLossError(absl::StrCat("telemetry history: a stored ", what,
                                            " does not parse"));
  }
  return absl::OkStatus();
}

int64_t Elements(const v1::TelemetryDeclaration& decl) {
  int64_t elements = 1;
  for (int64_t dim : decl.shape()) elements *= std::max<int64_t>(dim, 0);
  return elements;
}

bool Less(double a, double b) {  // NaN is never the minimum unless all are NaN
  if (std::isnan(a)) return false;
  if (std::isnan(b)) return true;
  return a < b;
}
bool Greater(double a, double b) {  // NaN is the maximum
  if (std::isnan(a)) return !std::isnan(b);
  if (std::isnan(b)) return false;
  return a > b;
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
  std::unique_ptr<HistoryStore> store(new HistoryStore(std::move(config)));
  RETURN_IF_ERROR(store->Open());
  return store;
}

HistoryStore::~HistoryStore() {
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
  return TransactionLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    RETURN_IF_ERROR(ExecLocked(kSchema));
    return ExecLocked("PRAGMA user_version=1");
  });
}

template <typename Body>
absl::Status HistoryStore::TransactionLocked(Body body) {
  auto run = [&](const char* sql) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
    ASSIGN_OR_RETURN(Stmt stmt, Stmt::Cached(db_, statements_, sql));
    return stmt.Run();
  };
  RETURN_IF_ERROR(run("BEGIN IMMEDIATE"));
  absl::Status status = body();
  if (status.ok()) status = run("COMMIT");
  if (!status.ok() && !sqlite3_get_autocommit(db_)) {
    (void)run("ROLLBACK");
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

absl::Status HistoryStore::PutHostLocked(const v1::HostSummary& summary, int64_t host_index) {
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
  ASSIGN_OR_RETURN(
      Stmt progress,
      Stmt::Cached(db_, statements_,
                   "INSERT INTO host_progress(job_id, host, persisted_through_step) "
                   "VALUES(?1, ?2, ?3) ON CONFLICT(job_id, host) DO UPDATE SET "
                   "persisted_through_step = MAX(persisted_through_step, "
                   "excluded.persisted_through_step)"));
  return progress.Bind(1, summary.job_id()).Bind(2, summary.host()).Bind(3, summary.step()).Run();
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
  if (summary.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
  if (summary.step() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("step ", summary.step(), " of job ",
                                                   summary.job_id(), " must be >= 1"));
  }
  v1::GlobalSummary stored = summary;
  stored.clear_host_detail();
  const std::string blob = stored.SerializeAsString();
  absl::MutexLock l(&mu_);
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
    for (int h = 0; h < summary.host_detail_size(); ++h) {
      RETURN_IF_ERROR(PutHostLocked(summary.host_detail(h), h));
    }
    return absl::OkStatus();
  });
}

absl::StatusOr<int64_t> HistoryStore::AppendHost(const v1::HostSummary& summary) {
  if (summary.job_id().empty()) return absl::InvalidArgumentError("job_id is empty");
  if (summary.host().empty()) return absl::InvalidArgumentError("host is empty");
  if (summary.step() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("step ", summary.step(), " of job ",
                                                   summary.job_id(), " must be >= 1"));
  }
  absl::MutexLock l(&mu_);
  int64_t persisted = 0;
  RETURN_IF_ERROR(TransactionLocked([&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) -> absl::Status {
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
      if (!exists) RETURN_IF_ERROR(PutHostLocked(summary, kUnknownHostIndex));
    }
    ASSIGN_OR_RETURN(Stmt stmt, Stmt::Cached(db_, statements_,
                                             "SELECT persisted_through_step FROM "
                                             "host_progress WHERE job_id = ?1 AND "
                                             "host = ?2"));
    ASSIGN_OR_RETURN(bool row, stmt.Bind(1, summary.job_id()).Bind(2, summary.host()).Step());
    persisted = row ? stmt.Int(0) : summary.step();
    return absl::OkStatus();
  }));
  return persisted;
}

absl::StatusOr<std::vector<v1::GlobalSummary>> HistoryStore::Read(
    const ReadRequest& request) const {
  if (request.since_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("since_step ", request.since_step, " is negative"));
  }
  if (request.limit < 1) {
    return absl::InvalidArgumentError(absl::StrCat("limit ", request.limit, " must be >= 1"));
  }
  absl::MutexLock l(&mu_);
  ASSIGN_OR_RETURN(int64_t latest, LatestStepLocked(request.job_id));
  if (request.since_step > latest + 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "since_step ", request.since_step, " is beyond the latest step ", latest, " of job ",
        request.job_id, "; use at most ", latest + 1));
  }
  const std::set<std::string> names(request.names.begin(), request.names.end());
  if (!names.empty()) {
    ASSIGN_OR_RETURN(auto series, SeriesLocked(request.job_id));
    for (const std::string& name : names) {
      if (series.count(name) == 0) {
        return absl::NotFoundError(
            absl::StrCat("series \"", name, "\" is not a series of job ", request.job_id));
      }
    }
  }
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT summary FROM global_summaries WHERE "
                                                 "job_id = ?1 AND step >= ?2 ORDER BY step "
                                                 "LIMIT ?3"));
  stmt.Bind(1, request.job_id).Bind(2, request.since_step).Bind(3, request.limit);
  std::vector<v1::GlobalSummary> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    v1::GlobalSummary& summary = out.emplace_back();
    RETURN_IF_ERROR(ParseRow(stmt, 0, summary, "global summary"));
    FilterValues(names, *summary.mutable_values());
  }
  if (request.host_detail) {
    ASSIGN_OR_RETURN(Stmt hosts, Stmt::Prepare(db_, "SELECT summary FROM host_summaries "
                                                    "WHERE job_id = ?1 AND step = ?2 "
                                                    "ORDER BY host_index, host"));
    for (v1::GlobalSummary& summary : out) {
      hosts.Reset();
      hosts.Bind(1, request.job_id).Bind(2, summary.step());
      while (true) {
        ASSIGN_OR_RETURN(bool row, hosts.Step());
        if (!row) break;
        v1::HostSummary* host = summary.add_host_detail();
        RETURN_IF_ERROR(ParseRow(hosts, 0, *host, "host summary"));
        FilterValues(names, *host->mutable_values());
      }
    }
  }
  return out;
}

absl::StatusOr<int64_t> HistoryStore::LatestStep(const std::string& job_id) const {
  absl::MutexLock l(&mu_);
  return LatestStepLocked(job_id);
}

absl::StatusOr<std::vector<HistoryStore::Point>> HistoryStore::ReadSeries(
    const SeriesRequest& request) const {
  if (request.max_points < 0 || (request.max_points > 0 && request.max_points < 4)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_points ", request.max_points, " must be 0 (every point) or >= 4"));
  }
  if (request.from_step > request.to_step) {
    return absl::InvalidArgumentError(absl::StrCat("from_step ", request.from_step,
                                                   " is after to_step ", request.to_step));
  }
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(JobExistsLocked(request.job_id));
  ASSIGN_OR_RETURN(auto series, SeriesLocked(request.job_id));
  auto it = series.find(request.name);
  if (it == series.end()) {
    return absl::NotFoundError(absl::StrCat("series \"", request.name,
                                            "\" is not a series of job ", request.job_id));
  }
  if (request.element < 0 || request.element >= it->second) {
    return absl::InvalidArgumentError(absl::StrCat("element ", request.element, " of series \"",
                                                   request.name, "\" is outside its ",
                                                   it->second, " elements"));
  }
  int64_t count = 0;
  {
    ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT COUNT(*) FROM series_points WHERE "
                                                   "job_id = ?1 AND name = ?2 AND element = ?3 "
                                                   "AND step BETWEEN ?4 AND ?5"));
    ASSIGN_OR_RETURN(bool row, stmt.Bind(1, request.job_id)
                                   .Bind(2, request.name)
                                   .Bind(3, request.element)
                                   .Bind(4, request.from_step)
                                   .Bind(5, request.to_step)
                                   .Step());
    if (row) count = stmt.Int(0);
  }
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT step, value FROM series_points WHERE "
                                                 "job_id = ?1 AND name = ?2 AND element = ?3 "
                                                 "AND step BETWEEN ?4 AND ?5 ORDER BY step"));
  stmt.Bind(1, request.job_id)
      .Bind(2, request.name)
      .Bind(3, request.element)
      .Bind(4, request.from_step)
      .Bind(5, request.to_step);
  std::vector<Point> out;
  const bool downsample = request.max_points > 0 && count > request.max_points;
  if (!downsample) {
    out.reserve(static_cast<size_t>(count));
    while (true) {
      ASSIGN_OR_RETURN(bool row, stmt.Step());
      if (!row) break;
      out.push_back(Point{stmt.Int(0), stmt.Real(1)});
    }
    return out;
  }
  // First and last kept; the interior (indexes 1..count-2) split into `buckets` runs of
  // consecutive points, each contributing its minimum and maximum in step order. count >
  // max_points >= 2 + 2 * buckets, so every bucket holds at least two points.
  const int64_t buckets = (request.max_points - 2) / 2;
  const int64_t interior = count - 2;
  out.reserve(static_cast<size_t>(2 + 2 * buckets));
  auto bucket_of = [&](int64_t index) { return (index - 1) * buckets / interior; };
  Point lo, hi;
  int64_t current = -1;
  auto flush = [&]() {
    if (current < 0) return;
    if (lo.step == hi.step) {
      out.push_back(lo);
    } else if (lo.step < hi.step) {
      out.push_back(lo);
      out.push_back(hi);
    } else {
      out.push_back(hi);
      out.push_back(lo);
    }
  };
  for (int64_t index = 0;; ++index) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    const Point point{stmt.Int(0), stmt.Real(1)};
    if (index == 0 || index == count - 1) {
      if (index == count - 1) {
        flush();
        current = -1;
      }
      out.push_back(point);
      continue;
    }
    const int64_t bucket = bucket_of(index);
    if (bucket != current) {
      flush();
      current = bucket;
      lo = hi = point;
      continue;
    }
    if (Less(point.value, lo.value)) lo = point;
    if (Greater(point.value, hi.value)) hi = point;
  }
  flush();  // nothing is left open unless the rows changed under us (they cannot: mu_ is held)
  return out;
}

absl::StatusOr<std::vector<v1::HostSummary>> HistoryStore::ReadHostSummaries(
    const std::string& job_id, int64_t after_step) const {
  absl::MutexLock l(&mu_);
  RETURN_IF_ERROR(JobExistsLocked(job_id));
  ASSIGN_OR_RETURN(Stmt stmt, Stmt::Prepare(db_, "SELECT summary FROM host_summaries WHERE "
                                                 "job_id = ?1 AND step > ?2 "
                                                 "ORDER BY step, host_index, host"));
  stmt.Bind(1, job_id).Bind(2, after_step);
  std::vector<v1::HostSummary> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    RETURN_IF_ERROR(ParseRow(stmt, 0, out.emplace_back(), "host summary"));
  }
  return out;
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
  std::vector<v1::TelemetryDeclaration> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) break;
    RETURN_IF_ERROR(ParseRow(stmt, 0, out.emplace_back(), "series declaration"));
  }
  return out;
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

}  // namespace meshrun::telemetry
