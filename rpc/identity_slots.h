// Fair shares of a capped resource between callers (limits: --max_slow_calls,
// --max_watch_streams and their --*_per_identity shares): one identity may hold at most its
// share, and view traffic (roles view and metrics) draws from a pool of its own, so no view
// caller, however many it opens, leaves an admin, a submitter or a worker without a slot.
//
//   pool of view callers       view, metrics: at most `limit` / 2 slots together
//   pool of the other callers  admin, submit, worker, coordinator: `limit` slots
//   each identity (role/name)  at most `per_identity` slots
//
// Callers without an identity (a plaintext server: no authentication at all) share a pool of
// `limit` and no share. Each pool is a PerKeySlots keyed by identity. Refusals are counted
// (rpc/refusal_log.h) under the reason "resource_exhausted <flag without dashes>".
//
// Lifetime: a Slot shares its pool's counters, so it may outlive its IdentitySlots.
// Thread-safety: Acquire and a Slot's release are safe from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "rpc/per_key_slots.h"
#include "rpc/security_policy.h"

namespace meshrun::services {

class IdentitySlots {
 public:
  using Slot = PerKeySlots::Slot;

  // `limit` 0: unlimited pools; `per_identity` 0: no per-identity share. `what` names the
  // resource ("WatchTelemetry streams"), `flag` and `per_identity_flag` the flags setting them.
  IdentitySlots(int64_t limit, int64_t per_identity, const std::string& what,
                const std::string& flag, const std::string& per_identity_flag);

  // Errors: RESOURCE_EXHAUSTED naming the identity's share or the pool that is full, its size
  // and the flag that sets it.
  absl::StatusOr<Slot> Acquire(const std::optional<Identity>& caller);

  // Slots held now, all pools together.
  int64_t open() const { return view_.open() + others_.open() + anonymous_.open(); }

 private:
  const std::string reason_;  // for RefusalLog
  PerKeySlots view_;
  PerKeySlots others_;
  PerKeySlots anonymous_;
};

}  // namespace meshrun::services
