#include "coordinator/key_value_store.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace meshrun::coordinator {
namespace {
// How often the timer thread looks for expired waiters; bounds how late a timeout fires.
constexpr absl::Duration kTimerPeriod = absl::Milliseconds(10);
}  // namespace

absl::StatusOr<std::unique_ptr<KeyValueStore>> KeyValueStore::Create(Config config) {
  if (config.max_value_bytes <= 0 || config.max_keys <= 0) {
    return absl::InvalidArgumentError("max_value_bytes and max_keys must be positive");
  }
  return std::unique_ptr<KeyValueStore>(new KeyValueStore(config));
}

KeyValueStore::KeyValueStore(Config config) : config_(config) {
  timer_ = std::thread([this] { TimerLoop(); });
}

KeyValueStore::~KeyValueStore() { CancelWaiters(); }

void KeyValueStore::CancelWaiters() {
  std::vector<GetCallback> gets;
  std::vector<BarrierCallback> barriers;
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
    for (auto& [key, waiter] : get_waiters_) gets.push_back(std::move(waiter.done));
    get_waiters_.clear();
    for (auto& [id, barrier] : barriers_) {
      for (auto& [deadline, done] : barrier.waiters) barriers.push_back(std::move(done));
      barrier.waiters.clear();
    }
  }
  if (timer_.joinable()) timer_.join();
  for (auto& done : gets) done(absl::CancelledError("key-value store shutting down"));
  for (auto& done : barriers) done(absl::CancelledError("key-value store shutting down"));
}

absl::Status KeyValueStore::Set(const std::string& key, std::string value, bool allow_overwrite) {
  if (key.empty() || absl::EndsWith(key, "/")) {
    return absl::InvalidArgumentError(
        absl::StrCat("key \"", key, "\" is empty or ends in '/'; name a key, not a directory"));
  }
  if (static_cast<int64_t>(value.size()) > config_.max_value_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("value of key ", key, " has ", value.size(),
                                                   " bytes; the limit is ",
                                                   config_.max_value_bytes));
  }
  std::vector<GetCallback> ready;
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (it != values_.end() && !allow_overwrite) {
      return absl::AlreadyExistsError(
          absl::StrCat("key ", key, " is already set; pass allow_overwrite to replace it"));
    }
    if (it == values_.end() && static_cast<int64_t>(values_.size()) >= config_.max_keys) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the store holds its limit of ", config_.max_keys, " keys; delete some"));
    }
    values_[key] = value;
    auto [first, last] = get_waiters_.equal_range(key);
    for (auto w = first; w != last; ++w) ready.push_back(std::move(w->second.done));
    get_waiters_.erase(first, last);
  }
  for (auto& done : ready) done(value);
  return absl::OkStatus();
}

void KeyValueStore::GetAsync(const std::string& key, absl::Time deadline, GetCallback done) {
  if (key.empty()) {
    done(absl::InvalidArgumentError("key is empty"));
    return;
  }
  absl::StatusOr<std::string> answer;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      answer = absl::CancelledError("key-value store shutting down");
    } else if (auto it = values_.find(key); it != values_.end()) {
      answer = it->second;
    } else {
      get_waiters_.emplace(key, GetWaiter{key, deadline, std::move(done)});
      return;
    }
  }
  done(std::move(answer));
}

absl::StatusOr<std::string> KeyValueStore::TryGet(const std::string& key) {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key ", key, " is not set"));
  return it->second;
}

std::vector<std::pair<std::string, std::string>> KeyValueStore::List(
    const std::string& directory) {
  const std::string prefix = absl::EndsWith(directory, "/") ? directory : directory + "/";
  absl::MutexLock lock(&mu_);
  std::vector<std::pair<std::string, std::string>> entries;
  for (auto it = values_.lower_bound(prefix);
       it != values_.end() && absl::StartsWith(it->first, prefix); ++it) {
    entries.emplace_back(it->first, it->second);
  }
  return entries;
}

absl::Status KeyValueStore::Delete(const std::string& key) {
  if (key.empty()) return absl::InvalidArgumentError("key is empty");
  absl::MutexLock lock(&mu_);
  if (!absl::EndsWith(key, "/")) {
    if (values_.erase(key) == 0) return absl::NotFoundError(absl::StrCat("key ", key, " is not set"));
    return absl::OkStatus();
  }
  auto first = values_.lower_bound(key);
  auto last = first;
  while (last != values_.end() && absl::StartsWith(last->first, key)) ++last;
  if (first == last) return absl::NotFoundError(absl::StrCat("no keys under ", key));
  values_.erase(first, last);
  return absl::OkStatus();
}

void KeyValueStore::WaitAtBarrier(const std::string& barrier_id, const std::string& task,
                                  const std::vector<std::string>& tasks, absl::Time deadline,
                                  BarrierCallback done) {
  const std::set<std::string> task_set(tasks.begin(), tasks.end());
  absl::Status answer;
  std::vector<BarrierCallback> released;
  {
    absl::MutexLock lock(&mu_);
    if (barrier_id.empty()) {
      answer = absl::InvalidArgumentError("barrier_id is empty");
    } else if (!task_set.contains(task)) {
      answer = absl::InvalidArgumentError(absl::StrCat(
          "task \"", task, "\" is not among the barrier's tasks (", absl::StrJoin(tasks, ", "),
          ")"));
    } else if (shutting_down_) {
      answer = absl::CancelledError("key-value store shutting down");
    } else {
      auto [it, created] = barriers_.try_emplace(barrier_id);
      Barrier& barrier = it->second;
      if (created) barrier.tasks = task_set;
      if (barrier.tasks != task_set) {
        answer = absl::InvalidArgumentError(absl::StrCat(
            "barrier ", barrier_id, " expects tasks (", absl::StrJoin(barrier.tasks, ", "),
            ") but this caller named (", absl::StrJoin(task_set, ", "), ")"));
      } else if (!barrier.complete) {
        barrier.arrived.insert(task);
        if (barrier.arrived != barrier.tasks) {
          barrier.waiters.emplace_back(deadline, std::move(done));
          return;
        }
        barrier.complete = true;
        for (auto& [d, waiter] : barrier.waiters) released.push_back(std::move(waiter));
        barrier.waiters.clear();
      }
    }
  }
  for (auto& waiter : released) waiter(absl::OkStatus());
  done(answer);
}

void KeyValueStore::TimerLoop() {
  while (true) {
    std::vector<std::pair<GetCallback, std::string>> expired_gets;
    std::vector<std::pair<BarrierCallback, std::string>> expired_barriers;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
      mu_.AwaitWithTimeout(absl::Condition(&shutting_down_), kTimerPeriod);
      if (shutting_down_) return;
      const absl::Time now = absl::Now();
      for (auto it = get_waiters_.begin(); it != get_waiters_.end();) {
        if (it->second.deadline <= now) {
          expired_gets.emplace_back(std::move(it->second.done),
                                    absl::StrCat("key ", it->first, " was not set in time"));
          it = get_waiters_.erase(it);
        } else {
          ++it;
        }
      }
      for (auto& [id, barrier] : barriers_) {
        std::vector<std::string> missing;
        for (const std::string& t : barrier.tasks) {
          if (!barrier.arrived.contains(t)) missing.push_back(t);
        }
        for (auto w = barrier.waiters.begin(); w != barrier.waiters.end();) {
          if (w->first <= now) {
            expired_barriers.emplace_back(
                std::move(w->second),
                absl::StrCat("barrier ", id, " timed out waiting for tasks: ",
                             absl::StrJoin(missing, ", ")));
            w = barrier.waiters.erase(w);
          } else {
            ++w;
          }
        }
      }
    }
    for (auto& [done, why] : expired_gets) done(absl::DeadlineExceededError(why));
    for (auto& [done, why] : expired_barriers) done(absl::DeadlineExceededError(why));
  }
}

absl::StatusOr<std::string> KeyValueStore::Get(const std::string& key, absl::Duration timeout) {
  absl::Notification ready;
  absl::StatusOr<std::string> result;
  GetAsync(key, absl::Now() + timeout, [&](absl::StatusOr<std::string> value) {
    result = std::move(value);
    ready.Notify();
  });
  ready.WaitForNotification();
  return result;
}

absl::Status KeyValueStore::WaitAtBarrierBlocking(const std::string& barrier_id,
                                                  const std::string& task,
                                                  const std::vector<std::string>& tasks,
                                                  absl::Duration timeout) {
  absl::Notification ready;
  absl::Status result;
  WaitAtBarrier(barrier_id, task, tasks, absl::Now() + timeout, [&](absl::Status status) {
    result = std::move(status);
    ready.Notify();
  });
  ready.WaitForNotification();
  return result;
}

}  // namespace meshrun::coordinator
