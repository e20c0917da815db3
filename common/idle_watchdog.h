// Cancels what goes idle: a stream (an upload) registers, touches its lease on every message,
// and is told to stop (`on_idle`, e.g. the call's TryCancel) once it has been idle for the
// timeout, so a client that opens an upload and stops sending cannot hold its place forever.
//
// Lifetime: leases must not outlive the watchdog; destroying a lease guarantees its on_idle
// is not running and will not run. Thread-safety: all methods are safe to call concurrently;
// on_idle runs on the watchdog's thread, under its lock: it must be quick and must not touch
// the watchdog (TryCancel is).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace meshrun {

class IdleWatchdog {
 public:
  class Lease {
   public:
    ~Lease();
    void Touch();

   private:
    friend class IdleWatchdog;
    Lease(IdleWatchdog* owner, int64_t id) : owner_(owner), id_(id) {}
    IdleWatchdog* const owner_;
    const int64_t id_;
  };

  // `idle_timeout` zero: never cancels. `period`: how often idleness is checked.
  explicit IdleWatchdog(absl::Duration idle_timeout, absl::Duration period = absl::Seconds(1));
  ~IdleWatchdog();

  std::unique_ptr<Lease> Watch(std::function<void()> on_idle);
  int64_t cancelled() const;  // how many leases went idle

 private:
  struct Entry {
    absl::Time touched;
    std::function<void()> on_idle;  // empty once fired
  };
  void Loop();

  const absl::Duration idle_timeout_;
  const absl::Duration period_;
  mutable absl::Mutex mu_;
  std::map<int64_t, Entry> entries_ ABSL_GUARDED_BY(mu_);
  int64_t next_id_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t cancelled_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace meshrun
