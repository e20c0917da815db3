// Per-client rate limit (token buckets), e.g. on SubmitJob: each client may make `burst` calls
// at once and `per_second` calls a second after that. Idle clients' buckets are dropped, so the
// table holds at most `max_clients` entries.
//
// Lifetime: Create() returns an owned limiter; the clock must outlive it.
// Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace meshrun::coordinator {

class RateLimiter {
 public:
  struct Config {
    double per_second = 20;  // zero: unlimited
    double burst = 100;
    int64_t max_clients = 10000;
    std::string what = "calls";  // named in errors ("SubmitJob calls")
    Clock* clock = &RealClock();
  };

  // Errors: INVALID_ARGUMENT (negative rate, burst < 1, max_clients < 1, null clock).
  static absl::StatusOr<std::unique_ptr<RateLimiter>> Create(Config config);

  // Takes one token of `client`'s bucket. Errors: RESOURCE_EXHAUSTED naming the rate and when
  // to retry.
  absl::Status Admit(const std::string& client);

 private:
  explicit RateLimiter(Config config) : config_(std::move(config)) {}
  struct Bucket {
    double tokens = 0;
    absl::Time updated;
  };
  const Config config_;
  absl::Mutex mu_;
  std::map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun::coordinator
