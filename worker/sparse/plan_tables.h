// The plan tables as fixed-shape arrays a compiled step takes as inputs: one BlockPlan per batch
// row, stacked along a leading row dimension. The layout (element type and shape) follows from
// the MaskContract alone, so it never changes with doc_ids, and matches examples/
// export_examples.py's SparseContract.plan (the exporter's mirror of PlanBuilder::Build):
//   block_mask    u8  [rows, nq, nkv]
//   data_next     IndexTable type  [rows, nq, W]
//   mask_next     IndexTable type  [rows, nq, W]
//   grid_width    IndexTable type  [rows, nq, 1]
//   partial_masks u8  [rows, C, block_q, block_kv]   C = min(nq, nkv) * W, zero padded
// Only the forward tables: the exported step differentiates through its gathers, so it needs no
// transposed (backward) tables.
//
// Lifetime: value types and free functions. Thread-safety: all functions are pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/sparse/block_plan.h"
#include "worker/sparse/mask_contract.h"

namespace meshrun::worker::sparse {

enum class PlanTable { kBlockMask, kDataNext, kMaskNext, kGridWidth, kPartialMasks };

// "block_mask", "data_next", "mask_next", "grid_width", "partial_masks".
const char* PlanTableName(PlanTable table);
// InvalidArgument for any other name (the message lists the valid ones).
absl::StatusOr<PlanTable> ParsePlanTable(absl::string_view name);

struct TableLayout {
  std::string dtype;          // meshrun dtype name: "u8", "u16" or "u32"
  std::vector<int64_t> dims;  // [rows, ...]
  int64_t element_bytes = 1;
  int64_t row_bytes() const;  // bytes of one batch row
};

// The layout of `table` for `rows` plans under `contract` (which must be valid).
TableLayout LayoutOf(const MaskContract& contract, PlanTable table, int64_t rows);

// Writes `plan`'s `table` as one row of LayoutOf(plan.contract, table, rows) into `row`, which
// has row_bytes() bytes. Internal if the plan's element types disagree with the layout (a plan
// built for another contract).
absl::Status WriteTableRow(const BlockPlan& plan, PlanTable table, char* row);

}  // namespace meshrun::worker::sparse
