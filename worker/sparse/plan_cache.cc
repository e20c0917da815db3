#include "worker/sparse/plan_cache.h"

#include <utility>

#include "common/status_macros.h"

namespace meshrun::worker::sparse {

absl::StatusOr<std::shared_ptr<const PlanBuilder>> PlanCache::GetOrCreate(
    const MaskContract& contract) {
  const MaskContract key = contract.Canonical();
  absl::MutexLock lock(&mu_);
  if (auto it = builders_.find(key); it != builders_.end()) {
    ++hits_;
    return it->second;
  }
  // Creation is O(num_q_blocks), cheap enough to do under the lock; it also means two racing
  // callers never build twice.
  ASSIGN_OR_RETURN(std::unique_ptr<PlanBuilder> created, PlanBuilder::Create(key));
  ++misses_;
  std::shared_ptr<const PlanBuilder> builder = std::move(created);
  builders_.emplace(key, builder);
  return builder;
}

int64_t PlanCache::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(builders_.size());
}

int64_t PlanCache::hits() const {
  absl::MutexLock lock(&mu_);
  return hits_;
}

int64_t PlanCache::misses() const {
  absl::MutexLock lock(&mu_);
  return misses_;
}

}  // namespace meshrun::worker::sparse
