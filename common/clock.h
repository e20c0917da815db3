// An injectable clock, so timeout and cadence logic is testable without sleeping.
//
// Lifetime: RealClock() returns a process-wide instance that is never destroyed. A FakeClock
// must outlive every component that was given it.
// Thread-safety: every method of both clocks is safe to call concurrently.
#pragma once

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace meshrun {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The system clock.
Clock& RealClock();

// A clock that moves only when told to. Starts at the Unix epoch plus one day, so that
// "zero" times never look valid by accident.
class FakeClock final : public Clock {
 public:
  FakeClock();
  absl::Time Now() const override;
  void Advance(absl::Duration d);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun
