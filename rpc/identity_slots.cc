#include "rpc/identity_slots.h"

#include "absl/strings/str_cat.h"

namespace meshrun::services {

// Slots held, by pool and by identity; identities are forgotten when they hold none, so the
// map stays as small as the set of callers holding slots now.
struct IdentitySlots::Slot::Counts {
  absl::Mutex mu;
  std::map<std::string, int64_t> by_pool ABSL_GUARDED_BY(mu);
  std::map<std::string, int64_t> by_identity ABSL_GUARDED_BY(mu);
};

IdentitySlots::Slot& IdentitySlots::Slot::operator=(Slot&& other) noexcept {
  if (this != &other) {
    Release();
    counts_ = std::move(other.counts_);
    pool_ = std::move(other.pool_);
    identity_ = std::move(other.identity_);
  }
  return *this;
}

void IdentitySlots::Slot::Release() {
  if (counts_ == nullptr) return;
  {
    absl::MutexLock lock(&counts_->mu);
    --counts_->by_pool[pool_];
    if (!identity_.empty() && --counts_->by_identity[identity_] <= 0) {
      counts_->by_identity.erase(identity_);
    }
  }
  counts_.reset();
}

IdentitySlots::IdentitySlots(int64_t limit, int64_t per_identity, std::string what,
                             std::string flag, std::string per_identity_flag)
    : limit_(limit),
      per_identity_(per_identity),
      what_(std::move(what)),
      flag_(std::move(flag)),
      per_identity_flag_(std::move(per_identity_flag)),
      counts_(std::make_shared<Slot::Counts>()) {}

absl::StatusOr<IdentitySlots::Slot> IdentitySlots::Acquire(const std::optional<Identity>& caller) {
  const bool view =
      caller.has_value() && (caller->role == Role::kView || caller->role == Role::kMetrics);
  const std::string pool = view ? "view" : "control";
  const int64_t pool_limit = view ? std::max<int64_t>(1, limit_ / 2) : limit_;
  const std::string identity =
      caller.has_value() ? absl::StrCat(RoleName(caller->role), "/", caller->name) : "";
  absl::MutexLock lock(&counts_->mu);
  if (!identity.empty() && per_identity_ > 0) {
    auto held = counts_->by_identity.find(identity);
    if (held != counts_->by_identity.end() && held->second >= per_identity_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          identity, " holds ", held->second, " ", what_, ", its share; close one, retry later, or "
          "start the coordinator with a larger ", per_identity_flag_));
    }
  }
  int64_t& in_pool = counts_->by_pool[pool];
  if (limit_ > 0 && in_pool >= pool_limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        pool_limit, " ", what_, " of ", view ? "view callers" : "admin, submit and worker callers",
        " are open, the limit; retry later, or start the coordinator with a larger ", flag_));
  }
  ++in_pool;
  if (!identity.empty()) ++counts_->by_identity[identity];
  return Slot(counts_, pool, identity);
}

int64_t IdentitySlots::open() const {
  absl::MutexLock lock(&counts_->mu);
  int64_t total = 0;
  for (const auto& [pool, held] : counts_->by_pool) total += held;
  return total;
}

}  // namespace meshrun::services
