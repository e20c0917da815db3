// A BatchSource decorator for block-sparse steps: takes each batch from an inner source (which
// yields the step's batch inputs up to, not including, the plan tables; one of them the
// per-token document ids, s32 [rows, seq_len]), builds one BlockPlan per row with the contract's
// PlanBuilder, and appends the requested plan tables (plan_tables.h layouts) in the step's
// input order. Shapes depend on the contract only, so moving document boundaries never change
// them (and never recompile the step).
//
// Thread-safety: as BatchSource: Next() from one thread at a time. Lifetime: owns the inner
// source; shares the builder (usually from a PlanCache); borrows Metrics, which must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/metrics.h"
#include "runtime/runtime.h"
#include "worker/sparse/block_plan.h"
#include "worker/sparse/plan_tables.h"
#include "worker/step_loop.h"

namespace meshrun::worker::sparse {

inline constexpr char kPlanTime[] = "PlanTime";  // timer: building one batch's tables

class PlanBatches final : public BatchSource {
 public:
  struct Config {
    std::unique_ptr<BatchSource> inner;
    std::shared_ptr<const PlanBuilder> builder;
    int doc_ids_index = 0;           // position of the doc_ids array in the inner batches
    std::vector<PlanTable> tables;   // appended in this order
    Metrics* metrics = nullptr;      // optional: receives kPlanTime
  };

  // InvalidArgument: no inner source or builder, a negative doc_ids_index, no tables.
  static absl::StatusOr<std::unique_ptr<PlanBatches>> Create(Config config);

  // The inner batch with the tables appended. Errors: the inner source's; InvalidArgument when
  // the doc_ids array is missing, not s32 [rows, seq_len], or a row is invalid for the planner
  // (decreasing, or needing more than max_grid_width tiles), naming the row.
  absl::StatusOr<std::vector<runtime::HostArray>> Next() override;
  // The tables depend on the batch alone: skipping is the inner source's.
  absl::Status Skip(int64_t consumed) override { return config_.inner->Skip(consumed); }

 private:
  explicit PlanBatches(Config config) : config_(std::move(config)) {}
  Config config_;
};

}  // namespace meshrun::worker::sparse
