#include "telemetry/history_sqlite.h"

namespace meshrun::telemetry::history_internal {

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

}  // namespace meshrun::telemetry::history_internal
