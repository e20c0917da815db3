#include "common/idle_watchdog.h"

#include <utility>

#include "absl/time/clock.h"

namespace meshrun {

IdleWatchdog::IdleWatchdog(absl::Duration idle_timeout, absl::Duration period)
    : idle_timeout_(idle_timeout), period_(period), thread_([this] { Loop(); }) {}

IdleWatchdog::~IdleWatchdog() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

std::unique_ptr<IdleWatchdog::Lease> IdleWatchdog::Watch(std::function<void()> on_idle) {
  absl::MutexLock lock(&mu_);
  const int64_t id = next_id_++;
  entries_[id] = {absl::Now(), std::move(on_idle)};
  return std::unique_ptr<Lease>(new Lease(this, id));
}

IdleWatchdog::Lease::~Lease() {
  absl::MutexLock lock(&owner_->mu_);
  owner_->entries_.erase(id_);
}

void IdleWatchdog::Lease::Touch() {
  absl::MutexLock lock(&owner_->mu_);
  if (auto it = owner_->entries_.find(id_); it != owner_->entries_.end()) {
    it->second.touched = absl::Now();
  }
}

int64_t IdleWatchdog::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void IdleWatchdog::Loop() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) {
    if (idle_timeout_ <= absl::ZeroDuration()) continue;
    const absl::Time now = absl::Now();
    for (auto& [id, entry] : entries_) {
      if (entry.on_idle && now - entry.touched >= idle_timeout_) {
        std::exchange(entry.on_idle, nullptr)();
        ++cancelled_;
      }
    }
  }
}

}  // namespace meshrun
