// HistoryStore's reads: summaries from a step on (watch backfill, export), one series'
// points downsampled for a chart, and the host summaries a restarted coordinator feeds back.
// Split from history_store.cc, which keeps the schema, the writes and retention.
#include <algorithm>
#include <cmath>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "telemetry/history_sqlite.h"
#include "telemetry/history_store.h"

namespace meshrun::telemetry {
namespace {

using history_internal::ParseRow;
using history_internal::ParseRows;
using history_internal::Stmt;

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

std::vector<std::string> Keys(const std::map<std::string, int64_t>& series) {
  std::vector<std::string> names;
  for (const auto& [name, elements] : series) names.push_back(name);
  return names;
}

}  // namespace

void FilterValues(const std::set<std::string>& names,
                  google::protobuf::RepeatedPtrField<v1::TelemetryValue>& values) {
  if (names.empty()) return;
  values.erase(std::remove_if(values.begin(), values.end(),
                              [&](const v1::TelemetryValue& value) {
                                return names.count(value.name()) == 0;
                              }),
               values.end());
}

absl::Status UnknownSeriesError(const std::string& name, const std::string& job_id,
                                const std::vector<std::string>& series) {
  return absl::NotFoundError(absl::StrCat(
      "series \"", name, "\" is not a series of job ", job_id, "; it has ",
      series.empty() ? "none yet" : absl::StrCat("\"", absl::StrJoin(series, "\", \""), "\"")));
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
      if (series.count(name) == 0) return UnknownSeriesError(name, request.job_id, Keys(series));
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
  if (it == series.end()) return UnknownSeriesError(request.name, request.job_id, Keys(series));
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
  return ParseRows<v1::HostSummary>(stmt, "host summary");
}

}  // namespace meshrun::telemetry
