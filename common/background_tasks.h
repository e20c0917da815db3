// Runs tasks on threads of their own, for work that must not block its caller (launching a
// job, reporting an outcome with retries). A task's thread is joined soon after it finished
// (on the next Run), so a long-lived server does not keep one thread per past task.
//
// Thread-safety: all methods may be called from any thread, except from a task of the same
// BackgroundTasks (JoinAll would wait for itself). Lifetime: the destructor waits for every
// task (JoinAll); what a task uses must outlive it.
#pragma once

#include <cstddef>
#include <functional>
#include <list>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace meshrun {

class BackgroundTasks {
 public:
  BackgroundTasks() = default;
  BackgroundTasks(const BackgroundTasks&) = delete;
  BackgroundTasks& operator=(const BackgroundTasks&) = delete;
  ~BackgroundTasks() { JoinAll(); }

  // Starts `task` on a new thread and joins the threads of tasks that finished.
  void Run(std::function<void()> task);
  // Waits for every task started so far.
  void JoinAll();
  // Tasks started and not yet joined (finished ones included until the next Run).
  size_t size() const;

 private:
  struct Task {
    std::thread thread;
    bool done = false;
  };
  mutable absl::Mutex mu_;
  std::list<Task> tasks_ ABSL_GUARDED_BY(mu_);
};

// Most threads a RunConcurrently call starts: a launch to a thousand hosts must not start a
// thousand threads (their stacks, and their contention on the coordinator's locks).
inline constexpr size_t kMaxConcurrentCalls = 64;

// Runs task(0) .. task(n - 1) on min(n, max_threads) threads, each taking the next index when it
// finishes one, and returns when all finished: calls to up to max_threads hosts cost the slowest
// one's time, not the sum; past that, about n / max_threads rounds of it.
void RunConcurrently(size_t n, const std::function<void(size_t)>& task,
                     size_t max_threads = kMaxConcurrentCalls);

}  // namespace meshrun
