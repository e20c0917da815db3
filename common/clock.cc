#include "common/clock.h"

#include "absl/time/clock.h"

namespace meshrun {
namespace {

class SystemClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock& RealClock() {
  static SystemClock* clock = new SystemClock();
  return *clock;
}

FakeClock::FakeClock() : now_(absl::UnixEpoch() + absl::Hours(24)) {}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

}  // namespace meshrun
