#include "rpc/identity_slots.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "rpc/refusal_log.h"

namespace meshrun::services {

IdentitySlots::IdentitySlots(int64_t limit, int64_t per_identity, const std::string& what,
                             const std::string& flag, const std::string& per_identity_flag)
    : reason_(absl::StrCat("resource_exhausted ", absl::StripPrefix(flag, "--"))),
      view_(limit > 0 ? std::max<int64_t>(1, limit / 2) : 0, per_identity,
            absl::StrCat(what, " (view callers)"), flag, per_identity_flag),
      others_(limit, per_identity, absl::StrCat(what, " (admin, submit and worker callers)"),
              flag, per_identity_flag),
      anonymous_(limit, 0, what, flag, per_identity_flag) {}

absl::StatusOr<IdentitySlots::Slot> IdentitySlots::Acquire(
    const std::optional<Identity>& caller) {
  absl::StatusOr<Slot> slot =
      !caller.has_value() ? anonymous_.Acquire("")
      : caller->role == Role::kView || caller->role == Role::kMetrics
          ? view_.Acquire(absl::StrCat(RoleName(caller->role), "/", caller->name))
          : others_.Acquire(absl::StrCat(RoleName(caller->role), "/", caller->name));
  if (slot.ok()) return slot;
  RefusalLog::Process().Record(CallerName(caller), reason_,
                               absl::StrCat("refused: ", slot.status().message()));
  // A full pool is RESOURCE_EXHAUSTED on gRPC, as a full share is: retry later.
  if (absl::IsUnavailable(slot.status())) {
    return absl::ResourceExhaustedError(slot.status().message());
  }
  return slot;
}

}  // namespace meshrun::services
