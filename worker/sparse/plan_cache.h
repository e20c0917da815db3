// Cache of PlanBuilders keyed by the static MaskContract. Per-batch doc_ids never enter the
// key: callers fetch the builder for their contract once and Build() each batch with it, so a
// moving document boundary can never create a new entry (or a recompile).
//
// Lifetime: entries live as long as the cache; returned builders are shared_ptrs and outlive
// it if held. There is no eviction: a process holds one entry per compiled mask contract, a
// handful. Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/sparse/block_plan.h"
#include "worker/sparse/mask_contract.h"

namespace meshrun::worker::sparse {

class PlanCache {
 public:
  PlanCache() = default;
  PlanCache(const PlanCache&) = delete;
  PlanCache& operator=(const PlanCache&) = delete;

  // The builder for contract.Canonical(), created on first use. InvalidArgument if the contract
  // fails Validate() (nothing is cached then).
  absl::StatusOr<std::shared_ptr<const PlanBuilder>> GetOrCreate(const MaskContract& contract);

  int64_t size() const;
  int64_t hits() const;
  int64_t misses() const;

 private:
  mutable absl::Mutex mu_;
  absl::flat_hash_map<MaskContract, std::shared_ptr<const PlanBuilder>> builders_
      ABSL_GUARDED_BY(mu_);
  int64_t hits_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace meshrun::worker::sparse
