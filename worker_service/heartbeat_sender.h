// A worker's side of StreamHeartbeats: one long-lived call carrying a beat per interval, where a
// unary Heartbeat costs the coordinator a whole call per beat (docs/scale.md). The stream opens
// on the first beat, and again on the first beat after it ended; the coordinator ends it with
// the refusal of the first beat it does not accept, which Beat then returns once.
//
// Lifetime: the stub must outlive the sender; the destructor ends an open stream and waits for
// gRPC to be done with it. Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "meshrun/v1/coordinator.grpc.pb.h"

namespace meshrun::services {

class HeartbeatSender {
 public:
  explicit HeartbeatSender(v1::Coordinator::Stub* stub) : stub_(stub) {}
  ~HeartbeatSender();
  HeartbeatSender(const HeartbeatSender&) = delete;
  HeartbeatSender& operator=(const HeartbeatSender&) = delete;

  // Sends `beat` on the open stream, opening one when none is open or the open one is another
  // incarnation's. While the previous beat is still being written (the coordinator is not
  // reading), `beat` waits behind it, replacing any beat already waiting. When the last stream
  // ended since the previous call, returns how, once, and sends nothing (the caller registers
  // again or retries on its next interval). Errors: as StreamHeartbeats (FAILED_PRECONDITION:
  // fenced; NOT_FOUND: forgotten; INVALID_ARGUMENT), UNAVAILABLE (the coordinator is
  // unreachable), CANCELLED after Stop.
  absl::Status Beat(const v1::HeartbeatRequest& beat);

  // Waits `timeout`, or less: until the open stream ends or Stop is called.
  void Wait(absl::Duration timeout);

  // Ends the open stream; Wait returns at once and Beat sends nothing from now on.
  void Stop();

 private:
  class Stream;
  void WriteNextLocked(Stream& stream) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReadEnded(Stream* stream);
  void WriteDone(Stream* stream);
  void Done(Stream* stream, absl::Status status);

  v1::Coordinator::Stub* const stub_;
  absl::Mutex mu_;
  Stream* open_ ABSL_GUARDED_BY(mu_) = nullptr;  // owned by gRPC until its OnDone
  int live_streams_ ABSL_GUARDED_BY(mu_) = 0;   // opened, OnDone not yet run
  std::optional<absl::Status> ended_ ABSL_GUARDED_BY(mu_);  // how open_ ended, not yet returned
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace meshrun::services
