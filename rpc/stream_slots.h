// A cap on the open streams of one kind (limits: --max_watch_streams, --max_upload_streams):
// a stream's reactor holds a Slot for its whole life; past the cap Acquire refuses.
//
// Lifetime: a Slot shares the counter, so it may outlive its StreamSlots.
// Thread-safety: Acquire, open() and a Slot's release are safe from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace meshrun::services {

class StreamSlots {
 public:
  // Held for a stream's life; releases its slot when destroyed. Empty when default-made.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&&) = default;
    Slot& operator=(Slot&& other) noexcept {
      if (this != &other) {
        Release();
        open_ = std::move(other.open_);
      }
      return *this;
    }
    ~Slot() { Release(); }

   private:
    friend class StreamSlots;
    explicit Slot(std::shared_ptr<std::atomic<int64_t>> open) : open_(std::move(open)) {}
    void Release() {
      if (open_ != nullptr) open_->fetch_sub(1);
      open_.reset();
    }
    std::shared_ptr<std::atomic<int64_t>> open_;
  };

  // `limit` 0: unlimited. `what` names the streams ("WatchTelemetry streams"), `flag` the flag
  // that sets the limit.
  StreamSlots(int64_t limit, std::string what, std::string flag)
      : limit_(limit), what_(std::move(what)), flag_(std::move(flag)) {}

  // Errors: RESOURCE_EXHAUSTED "<limit> <what> are open, the limit; close one, retry later, or
  // start the coordinator with a larger <flag>".
  absl::StatusOr<Slot> Acquire() {
    if (open_->fetch_add(1) >= limit_ && limit_ > 0) {
      open_->fetch_sub(1);
      return absl::ResourceExhaustedError(
          absl::StrCat(limit_, " ", what_, " are open, the limit; close one, retry later, or "
                       "start the coordinator with a larger ", flag_));
    }
    return Slot(open_);
  }

  int64_t open() const { return open_->load(); }

 private:
  const int64_t limit_;
  const std::string what_;
  const std::string flag_;
  std::shared_ptr<std::atomic<int64_t>> open_ = std::make_shared<std::atomic<int64_t>>(0);
};

}  // namespace meshrun::services
