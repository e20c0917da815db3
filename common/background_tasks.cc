#include "common/background_tasks.h"

#include <vector>

namespace meshrun {

void RunConcurrently(size_t n, const std::function<void(size_t)>& task) {
  std::vector<std::thread> threads;
  threads.reserve(n);
  for (size_t i = 0; i < n; ++i) threads.emplace_back(task, i);
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
