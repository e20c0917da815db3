#include "coordinator/straggler_detector.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"

namespace meshrun::coordinator {
namespace {

// The median of sorted `s` without its element at index `skip`: the median of one host's
// peers, read off the whole job's sorted list in O(1).
double MedianWithout(const std::vector<double>& s, size_t skip) {
  const size_t m = s.size() - 1;
  auto at = [&](size_t k) { return s[k < skip ? k : k + 1]; };
  return m % 2 == 1 ? at(m / 2) : (at(m / 2 - 1) + at(m / 2)) / 2;
}

// For hosts whose peers' median is `median`: every host's deviation from it, sorted, and where
// each host's own deviation sits in that order (to leave it out).
struct Deviations {
  double median = 0;
  std::vector<double> sorted;
  std::vector<size_t> position;  // by the host's index in the job's sorted times
};

Deviations DeviationsFrom(double median, const std::vector<double>& times) {
  Deviations d{.median = median};
  std::vector<size_t> order(times.size());
  for (size_t j = 0; j < order.size(); ++j) order[j] = j;
  auto deviation = [&](size_t j) { return std::fabs(times[j] - median); };
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return deviation(a) < deviation(b); });
  d.sorted.resize(order.size());
  d.position.resize(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    d.sorted[k] = deviation(order[k]);
    d.position[order[k]] = k;
  }
  return d;
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
  jobs_[job_id] = Job{.hosts = {hosts.begin(), hosts.end()}};
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
  if (!job.hosts.contains(host)) return false;
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
  // O(N log N) for N hosts (a thousand-host job judges every logging step): each host's peers'
  // median and MAD are the whole job's with that host left out. Leaving one element out of a
  // sorted list moves its median to one of at most three values, so at most three sorts of
  // deviations serve every host.
  std::vector<std::pair<double, const std::string*>> ranked;
  ranked.reserve(times.size());
  for (const auto& [host, t] : times) ranked.emplace_back(t, &host);
  std::sort(ranked.begin(), ranked.end());
  std::vector<double> sorted(ranked.size());
  for (size_t i = 0; i < ranked.size(); ++i) sorted[i] = ranked[i].first;
  std::vector<Deviations> by_median;
  for (size_t i = 0; i < ranked.size(); ++i) {
    const double median = MedianWithout(sorted, i);
    auto d = std::find_if(by_median.begin(), by_median.end(),
                          [&](const Deviations& e) { return e.median == median; });
    if (d == by_median.end()) {
      d = by_median.insert(by_median.end(), DeviationsFrom(median, sorted));
    }
    const double mad = MedianWithout(d->sorted, d->position[i]);
    const double bound = median + std::max(config_.mad_factor * mad, config_.min_margin * median);
    const std::string& host = *ranked[i].second;
    int& streak = job.slow_streak[host];
    streak = sorted[i] > bound ? streak + 1 : 0;
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
