// Fair shares of a capped resource between callers (limits: --max_slow_calls,
// --max_watch_streams and their --*_per_identity shares): one identity may hold at most its
// share, and view traffic (roles view and metrics) draws from a pool of its own, so no view
// caller, however many it opens, leaves an admin, a submitter or a worker without a slot.
//
//   pool "view"    view, metrics: at most `limit` / 2 slots together
//   pool "control" admin, submit, worker, coordinator: `limit` slots
//   each identity (role and name)                      : at most `per_identity` slots
//
// Callers without an identity (a plaintext server: no authentication at all) count against
// the control pool and no share.
//
// Lifetime: a Slot shares the counters, so it may outlive its IdentitySlots.
// Thread-safety: Acquire and a Slot's release are safe from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "rpc/security_policy.h"

namespace meshrun::services {

class IdentitySlots {
 public:
  // Held for a call's or a stream's life; gives its slot back when destroyed.
  class Slot {
   public:
    Slot() = default;
    Slot(Slot&&) = default;
    Slot& operator=(Slot&& other) noexcept;
    ~Slot() { Release(); }

   private:
    friend class IdentitySlots;
    struct Counts;
    Slot(std::shared_ptr<Counts> counts, std::string pool, std::string identity)
        : counts_(std::move(counts)), pool_(std::move(pool)), identity_(std::move(identity)) {}
    void Release();
    std::shared_ptr<Counts> counts_;
    std::string pool_;
    std::string identity_;  // empty: counted in no share
  };

  // `limit` 0: unlimited pools; `per_identity` 0: no per-identity share. `what` names the
  // resource ("WatchTelemetry streams"), `flag` and `per_identity_flag` the flags setting them.
  IdentitySlots(int64_t limit, int64_t per_identity, std::string what, std::string flag,
                std::string per_identity_flag);

  // Errors: RESOURCE_EXHAUSTED naming the share or pool that is full, its size and the flag
  // that sets it.
  absl::StatusOr<Slot> Acquire(const std::optional<Identity>& caller);

  // Slots held now, all pools together.
  int64_t open() const;

 private:
  const int64_t limit_;
  const int64_t per_identity_;
  const std::string what_;
  const std::string flag_;
  const std::string per_identity_flag_;
  std::shared_ptr<Slot::Counts> counts_;
};

}  // namespace meshrun::services
