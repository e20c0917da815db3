#include "coordinator/progress_monitor.h"

#include <algorithm>
#include <tuple>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace meshrun::coordinator {
namespace {

std::string Rounded(absl::Duration d) {
  return absl::FormatDuration(absl::Trunc(d, absl::Milliseconds(100)));
}

}  // namespace

absl::StatusOr<std::unique_ptr<ProgressMonitor>> ProgressMonitor::Create(Config config) {
  if (config.hang_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("hang_timeout must not be negative (0 turns it off)");
  }
  if (config.clock == nullptr) return absl::InvalidArgumentError("clock must not be null");
  return std::unique_ptr<ProgressMonitor>(new ProgressMonitor(config));
}

void ProgressMonitor::StartJob(const std::string& job_id, const std::vector<std::string>& hosts) {
  if (config_.hang_timeout == absl::ZeroDuration() || hosts.empty()) return;
  const absl::Time now = config_.clock->Now();
  absl::MutexLock lock(&mu_);
  auto& progress = jobs_[job_id];
  progress.clear();
  for (const std::string& host : hosts) progress[host] = {.advanced = now, .reported = now};
}

void ProgressMonitor::EndJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
}

void ProgressMonitor::Report(const std::string& host, const std::string& job_id,
                             int64_t last_completed_step, const std::string& phase) {
  const absl::Time now = config_.clock->Now();
  absl::MutexLock lock(&mu_);
  auto job = jobs_.find(job_id);
  if (job == jobs_.end()) return;
  auto it = job->second.find(host);
  if (it == job->second.end()) return;
  HostProgress& p = it->second;
  if (last_completed_step > p.step) {
    p.step = last_completed_step;
    p.advanced = now;
  }
  p.phase = phase;
  p.reported = now;
  p.ever_reported = true;
}

std::vector<ProgressMonitor::Hang> ProgressMonitor::Overdue() {
  std::vector<Hang> hangs;
  if (config_.hang_timeout == absl::ZeroDuration()) return hangs;
  const absl::Time now = config_.clock->Now();
  absl::MutexLock lock(&mu_);
  for (auto it = jobs_.begin(); it != jobs_.end();) {
    absl::Time last_advance = absl::InfinitePast();
    for (const auto& [host, p] : it->second) last_advance = std::max(last_advance, p.advanced);
    if (now - last_advance < config_.hang_timeout) {
      ++it;
      continue;
    }
    hangs.push_back(Describe(it->first, it->second, now));
    it = jobs_.erase(it);
  }
  return hangs;
}

ProgressMonitor::Hang ProgressMonitor::Describe(
    const std::string& job_id, const Hosts& hosts, absl::Time now) const {
  // Lowest step first; then a host not waiting in a collective; then the stalest report.
  auto rank = [](const HostProgress& p) {
    return std::make_tuple(p.step, p.phase == kPhaseGradientAllReduce, p.reported);
  };
  auto culprit = hosts.begin();
  for (auto it = hosts.begin(); it != hosts.end(); ++it) {
    if (rank(it->second) < rank(culprit->second)) culprit = it;
  }
  const HostProgress& c = culprit->second;
  absl::Time last_advance = absl::InfinitePast();
  for (const auto& [host, p] : hosts) last_advance = std::max(last_advance, p.advanced);
  std::string where;
  if (now - c.reported >= config_.hang_timeout / 2) {
    where = c.ever_reported
                ? absl::StrCat("no report for ", Rounded(now - c.reported))
                : "it never reported";
  } else {
    where = c.phase.empty() ? "no phase reported" : absl::StrCat("in ", c.phase);
  }
  std::vector<std::string> others;
  for (const auto& [host, p] : hosts) {
    if (host == culprit->first) continue;
    if (p.phase == kPhaseGradientAllReduce) {
      others.push_back(absl::StrCat(host, " waits in ", p.phase, " after step ", p.step));
    } else {
      others.push_back(absl::StrCat(host, " is at step ", p.step,
                                    p.phase.empty() ? "" : absl::StrCat(" in ", p.phase)));
    }
  }
  return Hang{
      .job_id = job_id,
      .host = culprit->first,
      .error = absl::StrCat(culprit->first, " made no progress since step ", c.step, " (", where,
                            ")", others.empty() ? "" : "; ", absl::StrJoin(others, "; "),
                            "; no host completed a step for ",
                            Rounded(now - last_advance), " (--hang_timeout ",
                            absl::FormatDuration(config_.hang_timeout), ")")};
}

}  // namespace meshrun::coordinator
