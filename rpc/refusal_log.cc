#include "rpc/refusal_log.h"

#include <spdlog/spdlog.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace meshrun::services {

std::string CallerName(const std::optional<Identity>& caller) {
  return caller.has_value() ? absl::StrCat(RoleName(caller->role), "/", caller->name)
                            : "unauthenticated";
}

bool RefusalLog::RecordCall(const std::optional<Identity>& caller, const std::string& method,
                            const absl::Status& status, const std::string& what) {
  const size_t slash = method.rfind('/');
  return Record(CallerName(caller),
                absl::StrCat(absl::AsciiStrToLower(absl::StatusCodeToString(status.code())), " ",
                             slash == std::string::npos ? method : method.substr(slash + 1)),
                what);
}

RefusalLog& RefusalLog::Process() {
  static auto* log = new RefusalLog(absl::Seconds(10), 20);
  return *log;
}

bool RefusalLog::Record(const std::string& caller, const std::string& reason,
                        const std::string& what) {
  const absl::Time now = absl::Now();
  int64_t unlogged = 0;
  {
    absl::MutexLock lock(&mu_);
    auto key = std::make_pair(caller, reason);
    // Callers and methods (a refused call's path is the caller's to choose) stay bounded.
    if (!pairs_.contains(key) && pairs_.size() >= kMaxPairs) key = {"other", "other"};
    Pair& pair = pairs_[key];
    ++pair.count;
    if (now - window_start_ >= interval_) {
      window_start_ = now;
      lines_in_window_ = 0;
    }
    if (now - pair.last_line < interval_ || lines_in_window_ >= lines_per_interval_) {
      ++pair.unlogged;
      return false;
    }
    ++lines_in_window_;
    pair.last_line = now;
    unlogged = pair.unlogged;
    pair.unlogged = 0;
  }
  if (unlogged > 0) {
    spdlog::warn("{} ({} more refusals of {} for {} not logged since its last line)", what,
                 unlogged, caller, reason);
  } else {
    spdlog::warn("{}", what);
  }
  return true;
}

std::map<std::pair<std::string, std::string>, int64_t> RefusalLog::Counts() const {
  absl::MutexLock lock(&mu_);
  std::map<std::pair<std::string, std::string>, int64_t> counts;
  for (const auto& [key, pair] : pairs_) counts[key] = pair.count;
  return counts;
}

}  // namespace meshrun::services
