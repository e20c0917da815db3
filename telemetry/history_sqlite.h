// The SQLite plumbing of HistoryStore, shared by its source files (history_store.cc: schema
// and writes; history_read.cc: reads; history_retention.cc: rewind and pruning;
// history_forget.cc: forgetting a job): errors
// mapped to absl codes, and Stmt, one prepared statement with its bindings and columns.
// Internal to telemetry/.
//
// Thread-safety: none of its own; HistoryStore calls it with its mutex held.
#pragma once

#include <sqlite3.h>

#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "telemetry/history_store.h"

namespace meshrun::telemetry::history_internal {

// "telemetry history: <what>: <sqlite's message>" with a code by kind: DATA_LOSS (corrupt, not a
// database), RESOURCE_EXHAUSTED (disk full), UNAVAILABLE (cannot open), INTERNAL otherwise.
absl::Status SqliteError(sqlite3* db, int rc, absl::string_view what);

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
  static absl::StatusOr<Stmt> Cached(sqlite3* db, StatementCache& cache, const char* sql) {
    auto found = cache.find(absl::string_view(sql));  // no copy of the text per call
    if (found == cache.end()) found = cache.emplace(sql, CachedStatement()).first;
    CachedStatement& entry = found->second;
    if (entry.in_use) return Prepare(db, sql);
    if (entry.stmt == nullptr) {
      const int rc =
          sqlite3_prepare_v3(db, sql, -1, SQLITE_PREPARE_PERSISTENT, &entry.stmt, nullptr);
      if (rc != SQLITE_OK) {
        cache.erase(found);
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

// Parses the blob in column `col` into `out`. Errors: DATA_LOSS naming `what`.
template <typename Message>
absl::Status ParseRow(const Stmt& stmt, int col, Message& out, absl::string_view what) {
  if (!out.ParseFromArray(stmt.Blob(col), stmt.Bytes(col))) {
    return absl::DataLossError(absl::StrCat("telemetry history: a stored ", what,
                                            " does not parse"));
  }
  return absl::OkStatus();
}

// Every remaining row's column 0 parsed into a Message. Errors: Step's; ParseRow's.
template <typename Message>
absl::StatusOr<std::vector<Message>> ParseRows(Stmt& stmt, absl::string_view what) {
  std::vector<Message> out;
  while (true) {
    ASSIGN_OR_RETURN(bool row, stmt.Step());
    if (!row) return out;
    RETURN_IF_ERROR(ParseRow(stmt, 0, out.emplace_back(), what));
  }
}

}  // namespace meshrun::telemetry::history_internal
