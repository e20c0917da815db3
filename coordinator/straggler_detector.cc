#include "coordinator/straggler_detector.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"

namespace meshrun::coordinator {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

}  // namespace

absl::StatusOr<std::unique_ptr<StragglerDetector>> StragglerDetector::Create(Config config) {
  if (config.mad_factor < 0) return absl::InvalidArgumentError("mad_factor must be >= 0");
  if (config.min_margin < 0) return absl::InvalidArgumentError("min_margin must be >= 0");
  if (config.consecutive < 1) return absl::InvalidArgumentError("consecutive must be >= 1");
  return std::unique_ptr<StragglerDetector>(new StragglerDetector(config));
}

void StragglerDetector::StartJob(const std::string& job_id,
                                 const std::vector<std::string>& hosts) {
  absl::MutexLock lock(&mu_);
  jobs_[job_id] = Job{.hosts = hosts};
}

void StragglerDetector::EndJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  jobs_.erase(job_id);
}

bool StragglerDetector::Observe(const std::string& job_id, const std::string& host,
                                int64_t step, double step_time_seconds) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return false;
  Job& job = it->second;
  if (std::find(job.hosts.begin(), job.hosts.end(), host) == job.hosts.end()) return false;
  auto& times = job.pending[step];
  times[host] = step_time_seconds;
  if (times.size() < job.hosts.size()) {
    // A step some host never reports (it died, or a restart) must not pile up.
    while (job.pending.size() > 64) job.pending.erase(job.pending.begin());
    return false;
  }
  const std::map<std::string, double> complete = std::move(times);
  job.pending.erase(step);
  return Judge(job, complete);
}

bool StragglerDetector::Judge(Job& job, const std::map<std::string, double>& times) {
  if (times.size() < 2) return false;
  const auto before = job.flagged;
  for (const auto& [host, t] : times) {
    std::vector<double> peers;
    for (const auto& [other, u] : times) {
      if (other != host) peers.push_back(u);
    }
    const double median = Median(peers);
    std::vector<double> deviations;
    for (double u : peers) deviations.push_back(std::fabs(u - median));
    const double mad = Median(deviations);
    const double bound = median + std::max(config_.mad_factor * mad, config_.min_margin * median);
    int& streak = job.slow_streak[host];
    streak = t > bound ? streak + 1 : 0;
    if (streak >= config_.consecutive) {
      job.flagged.insert(host);
    } else if (streak == 0) {
      job.flagged.erase(host);
    }
  }
  return job.flagged != before;
}

std::vector<std::string> StragglerDetector::Flagged(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return {};
  return {it->second.flagged.begin(), it->second.flagged.end()};
}

}  // namespace meshrun::coordinator
