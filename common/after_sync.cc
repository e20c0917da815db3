#include "common/after_sync.h"

#include <spdlog/spdlog.h>

#include <utility>

namespace meshrun {

AfterSync::AfterSync(std::function<absl::Status()> sync, absl::Duration retry)
    : sync_(std::move(sync)), retry_(retry), thread_([this] { Loop(); }) {}

AfterSync::~AfterSync() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void AfterSync::Run(std::function<void()> action) {
  absl::MutexLock l(&mu_);
  queued_.push_back(std::move(action));
}

void AfterSync::Loop() {
  std::vector<std::function<void()>> round;
  while (true) {
    bool stopping = false;
    {
      absl::MutexLock l(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_ || !queued_.empty();
      };
      if (round.empty()) mu_.Await(absl::Condition(&ready));  // a failed round goes on
      stopping = stop_;
      for (auto& action : queued_) round.push_back(std::move(action));
      queued_.clear();
    }
    if (round.empty()) return;  // stopping, and nothing left
    if (absl::Status synced = sync_(); !synced.ok()) {
      spdlog::error("{} action(s) wait for a sync that failed: {}", round.size(),
                    synced.ToString());
      if (stopping) return;  // the last round: dropped, as if the process had stopped
      absl::MutexLock l(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), retry_);
      continue;  // the round is kept: tried again with whatever came meanwhile
    }
    for (auto& action : round) action();
    round.clear();  // stopping: the next pass takes what came meanwhile, or returns
  }
}

}  // namespace meshrun
