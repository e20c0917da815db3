// Actions that must wait until what came before them is on disk, without making their caller
// wait for the disk: the coordinator acknowledges a committed telemetry step to its hosts only
// once the step survives power loss, while watchers see it as soon as it is committed.
//
// A thread of its own runs rounds: each takes every action queued so far, calls `sync` once,
// and then runs them in the order they were queued (a group commit: one sync covers all that
// arrived while the last one ran). When `sync` fails, the round is kept and tried again
// `retry` later; its actions run only after a sync that succeeded.
//
// Lifetime: the destructor runs a last round for what is queued (one try) and joins the
// thread; `sync` and whatever the actions use must outlive it. Thread-safety: Run may be
// called from any thread; `sync` and the actions run on the thread, never concurrently.
#pragma once

#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace meshrun {

class AfterSync {
 public:
  explicit AfterSync(std::function<absl::Status()> sync,
                     absl::Duration retry = absl::Milliseconds(100));
  ~AfterSync();
  AfterSync(const AfterSync&) = delete;
  AfterSync& operator=(const AfterSync&) = delete;

  // Queues `action` to run after the next sync that starts from now on succeeds.
  void Run(std::function<void()> action) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  const std::function<absl::Status()> sync_;
  const absl::Duration retry_;
  absl::Mutex mu_;
  std::vector<std::function<void()>> queued_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace meshrun
