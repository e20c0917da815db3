#include "coordinator/key_value_store.h"

#include <algorithm>

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

std::string NamespaceOf(const std::string& key) { return key.substr(0, key.find('/')); }
}  // namespace

absl::StatusOr<std::unique_ptr<KeyValueStore>> KeyValueStore::Create(Config config) {
  for (int64_t limit : {config.max_key_bytes, config.max_value_bytes, config.max_keys,
                        config.max_total_bytes, config.max_keys_per_namespace,
                        config.max_bytes_per_namespace, config.max_barriers,
                        config.max_barrier_tasks, config.max_waiters}) {
    if (limit <= 0) return absl::InvalidArgumentError("every key-value limit must be positive");
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
  if (static_cast<int64_t>(key.size()) > config_.max_key_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("key has ", key.size(),
                                                   " bytes; the limit is ",
                                                   config_.max_key_bytes));
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
    const bool exists = it != values_.end();
    const int64_t old_bytes = exists ? static_cast<int64_t>(key.size() + it->second.size()) : 0;
    const int64_t bytes = static_cast<int64_t>(key.size() + value.size());
    if (absl::Status quota = CheckQuotaLocked(key, exists, old_bytes, bytes); !quota.ok()) {
      return quota;
    }
    AccountLocked(key, exists ? 0 : 1, bytes - old_bytes);
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
    } else if (static_cast<int64_t>(get_waiters_.size()) >= config_.max_waiters) {
      answer = absl::ResourceExhaustedError(absl::StrCat(
          config_.max_waiters, " calls already wait for keys; retry later"));
    } else {
      get_waiters_.emplace(key, GetWaiter{key, deadline, std::move(done)});
      waiter_added_ = true;
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
    auto it = values_.find(key);
    if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key ", key, " is not set"));
    AccountLocked(key, -1, -static_cast<int64_t>(key.size() + it->second.size()));
    values_.erase(it);
    return absl::OkStatus();
  }
  auto first = values_.lower_bound(key);
  auto last = first;
  while (last != values_.end() && absl::StartsWith(last->first, key)) {
    AccountLocked(last->first, -1, -static_cast<int64_t>(last->first.size() + last->second.size()));
    ++last;
  }
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
    int64_t name_bytes = static_cast<int64_t>(barrier_id.size());
    for (const std::string& t : task_set) name_bytes = std::max<int64_t>(name_bytes, t.size());
    if (barrier_id.empty()) {
      answer = absl::InvalidArgumentError("barrier_id is empty");
    } else if (name_bytes > config_.max_key_bytes) {
      answer = absl::InvalidArgumentError(absl::StrCat(
          "barrier id or a task name has ", name_bytes, " bytes; the limit is ",
          config_.max_key_bytes));
    } else if (static_cast<int64_t>(task_set.size()) > config_.max_barrier_tasks) {
      answer = absl::InvalidArgumentError(absl::StrCat("barrier ", barrier_id, " names ",
                                                       task_set.size(), " tasks; the limit is ",
                                                       config_.max_barrier_tasks));
    } else if (!barriers_.contains(barrier_id) &&
               static_cast<int64_t>(barriers_.size()) >= config_.max_barriers) {
      answer = absl::ResourceExhaustedError(absl::StrCat(
          config_.max_barriers, " barriers are live; wait for them to complete or expire"));
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
      barrier.touched = absl::Now();
      if (barrier.tasks != task_set) {
        answer = absl::InvalidArgumentError(absl::StrCat(
            "barrier ", barrier_id, " expects tasks (", absl::StrJoin(barrier.tasks, ", "),
            ") but this caller named (", absl::StrJoin(task_set, ", "), ")"));
      } else if (!barrier.complete) {
        barrier.arrived.insert(task);
        if (barrier.arrived != barrier.tasks) {
          barrier.waiters.emplace_back(deadline, std::move(done));
          waiter_added_ = true;
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
  absl::Time collected = absl::Now();
  while (true) {
    std::vector<std::pair<GetCallback, std::string>> expired_gets;
    std::vector<std::pair<BarrierCallback, std::string>> expired_barriers;
    {
      absl::MutexLock lock(&mu_);
      if (shutting_down_) return;
      // Polls while a call waits; otherwise sleeps until one does (or the next collection), so
      // an idle coordinator is not woken 100 times a second.
      bool waiting = !get_waiters_.empty();
      for (const auto& [id, barrier] : barriers_) waiting = waiting || !barrier.waiters.empty();
      mu_.AwaitWithTimeout(absl::Condition(this, &KeyValueStore::TimerHasWorkLocked),
                           waiting ? kTimerPeriod : absl::Seconds(1));
      waiter_added_ = false;
      if (shutting_down_) return;
      const absl::Time now = absl::Now();
      if (now - collected >= absl::Seconds(1)) {
        CollectBarriersLocked(now);
        collected = now;
      }
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

absl::Status KeyValueStore::CheckQuotaLocked(const std::string& key, bool exists,
                                             int64_t old_bytes, int64_t bytes) {
  const std::string space = NamespaceOf(key);
  const Usage& used = namespaces_[space];
  const int64_t more = bytes - old_bytes;
  if (!exists && total_.keys >= config_.max_keys) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the store holds its limit of ", config_.max_keys, " keys; delete some"));
  }
  if (total_.bytes + more > config_.max_total_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the store holds its limit of ", config_.max_total_bytes, " bytes; delete some keys"));
  }
  if (!exists && used.keys >= config_.max_keys_per_namespace) {
    return absl::ResourceExhaustedError(
        absl::StrCat("namespace \"", space, "/\" holds its limit of ",
                     config_.max_keys_per_namespace, " keys; delete some"));
  }
  if (used.bytes + more > config_.max_bytes_per_namespace) {
    return absl::ResourceExhaustedError(
        absl::StrCat("namespace \"", space, "/\" holds its limit of ",
                     config_.max_bytes_per_namespace, " bytes; delete some keys"));
  }
  return absl::OkStatus();
}

void KeyValueStore::AccountLocked(const std::string& key, int64_t keys, int64_t bytes) {
  total_.keys += keys;
  total_.bytes += bytes;
  auto it = namespaces_.try_emplace(NamespaceOf(key)).first;
  it->second.keys += keys;
  it->second.bytes += bytes;
  if (it->second.keys == 0) namespaces_.erase(it);
}

void KeyValueStore::CollectBarriersLocked(absl::Time now) {
  for (auto it = barriers_.begin(); it != barriers_.end();) {
    if (it->second.waiters.empty() && now - it->second.touched >= config_.barrier_ttl) {
      it = barriers_.erase(it);
    } else {
      ++it;
    }
  }
}

KeyValueStore::Stats KeyValueStore::stats() {
  absl::MutexLock lock(&mu_);
  return {.keys = total_.keys,
          .bytes = total_.bytes,
          .barriers = static_cast<int64_t>(barriers_.size()),
          .waiters = static_cast<int64_t>(get_waiters_.size())};
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
