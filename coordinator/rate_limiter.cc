#include "coordinator/rate_limiter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace meshrun::coordinator {

absl::StatusOr<std::unique_ptr<RateLimiter>> RateLimiter::Create(Config config) {
  if (config.per_second < 0 || config.burst < 1 || config.max_clients < 1 ||
      config.clock == nullptr) {
    return absl::InvalidArgumentError(
        "rate limit: per_second must be >= 0, burst >= 1, max_clients >= 1");
  }
  return std::unique_ptr<RateLimiter>(new RateLimiter(std::move(config)));
}

absl::Status RateLimiter::Admit(const std::string& client) {
  if (config_.per_second == 0) return absl::OkStatus();
  const absl::Time now = config_.clock->Now();
  absl::MutexLock lock(&mu_);
  auto it = buckets_.find(client);
  if (it == buckets_.end()) {
    if (static_cast<int64_t>(buckets_.size()) >= config_.max_clients) {
      // Full buckets are the same as no bucket: drop them.
      for (auto b = buckets_.begin(); b != buckets_.end();) {
        const double refill = absl::ToDoubleSeconds(now - b->second.updated) * config_.per_second;
        b = b->second.tokens + refill >= config_.burst ? buckets_.erase(b) : std::next(b);
      }
    }
    if (static_cast<int64_t>(buckets_.size()) >= config_.max_clients) {
      return absl::ResourceExhaustedError(absl::StrCat(
          config_.max_clients, " clients are being rate limited at once; retry later"));
    }
    it = buckets_.emplace(client, Bucket{config_.burst, now}).first;
  }
  Bucket& bucket = it->second;
  bucket.tokens = std::min(
      config_.burst,
      bucket.tokens + absl::ToDoubleSeconds(now - bucket.updated) * config_.per_second);
  bucket.updated = now;
  if (bucket.tokens < 1) {
    const double wait = (1 - bucket.tokens) / config_.per_second;
    return absl::ResourceExhaustedError(absl::StrCat(
        "client ", client, " is over its rate of ", config_.per_second, " ", config_.what,
        " a second (burst ", config_.burst, "); retry in ", absl::FormatDuration(
            absl::Seconds(wait))));
  }
  bucket.tokens -= 1;
  return absl::OkStatus();
}

}  // namespace meshrun::coordinator
