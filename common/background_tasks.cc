#include "common/background_tasks.h"

#include <algorithm>
#include <atomic>
#include <vector>

namespace meshrun {

void RunConcurrently(size_t n, const std::function<void(size_t)>& task, size_t max_threads) {
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < n; i = next++) task(i);
  };
  std::vector<std::thread> threads;
  const size_t count = std::min(n, std::max<size_t>(max_threads, 1));
  threads.reserve(count);
  for (size_t t = 0; t < count; ++t) threads.emplace_back(work);
  for (std::thread& thread : threads) thread.join();
}

void BackgroundTasks::Run(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  for (auto it = tasks_.begin(); it != tasks_.end();) {
    if (!it->done) {
      ++it;
      continue;
    }
    it->thread.join();  // returns at once: the task already ended
    it = tasks_.erase(it);
  }
  auto slot = tasks_.emplace(tasks_.end());
  // The new thread marks its slot under mu_, so it waits until this Run released it.
  slot->thread = std::thread([this, slot, task = std::move(task)] {
    task();
    absl::MutexLock lock(&mu_);
    slot->done = true;
  });
}

void BackgroundTasks::JoinAll() {
  std::list<Task> tasks;
  {
    absl::MutexLock lock(&mu_);
    tasks.swap(tasks_);
  }
  // The threads still reach their slots: std::list nodes keep their addresses when spliced
  // between lists, and each marks `done` under mu_ before it ends.
  for (Task& t : tasks) t.thread.join();
}

size_t BackgroundTasks::size() const {
  absl::MutexLock lock(&mu_);
  return tasks_.size();
}

}  // namespace meshrun
