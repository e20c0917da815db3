// Planner stages for routed block-sparse attention, each a separate pure function so each
// contract can be tested on its own:
//
//   SelectUnion         scores -> per q block, top-k kv blocks of every head, unioned
//   ApplyCausalWindow   drop kv blocks the causal/window contract forbids
//   ExpandHierarchical  coarse super-block choice -> fine blocks
//   CheckLegality       every entry is a legal tile and no query row is left without one
//
// A WorkSet is the compact hand-off between stages (and into PlanBuilder::BuildRouted):
// per q block, the kv blocks to visit. Every stage's output passes CheckLegality.
//
// Thread-safety: all functions are pure; safe from any thread. Errors: InvalidArgument,
// naming the field or the offending row/entry and the fix.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/sparse/mask_contract.h"

namespace meshrun::worker::sparse {

// Inclusive range of block indices; empty when first > last.
struct BlockRange {
  int32_t first = 0;
  int32_t last = -1;
  bool contains(int32_t b) const { return b >= first && b <= last; }
  int32_t size() const { return last >= first ? last - first + 1 : 0; }
};

// Kv blocks q block `q_block` may touch under causal + window, ignoring documents.
// Requires a contract that passes Validate().
BlockRange PositionalKvRange(const MaskContract& contract, int32_t q_block);

// Kv blocks holding the q block's own token positions. Every token may attend itself, so these
// keep each query row non-empty; selection always includes them.
BlockRange DiagonalKvRange(const MaskContract& contract, int32_t q_block);

struct WorkSet {
  // rows[q_block]: ascending, unique kv block indices.
  std::vector<std::vector<int32_t>> rows;
  friend bool operator==(const WorkSet&, const WorkSet&) = default;
};

// Per q block and per head, keeps the diagonal kv block(s) and fills the remaining top_k slots
// with the highest-scoring legal kv blocks (causal: no future blocks; window respected; ties go
// to the lower index), then unions the heads' choices. `scores` is row-major
// [heads_per_plan][num_q_blocks][num_kv_blocks]. Rows with fewer legal blocks than top_k keep
// all of them. Errors: invalid contract; scores of the wrong size; a NaN score; top_k < 1 or
// larger than the legal kv blocks of the widest row.
absl::StatusOr<WorkSet> SelectUnion(const MaskContract& contract, absl::Span<const float> scores,
                                    int32_t top_k);

// Drops entries outside each row's PositionalKvRange and re-adds the diagonal block(s), so a
// row is never left empty. Errors: invalid contract; wrong row count; an entry outside
// [0, num_kv_blocks).
absl::StatusOr<WorkSet> ApplyCausalWindow(const MaskContract& contract, const WorkSet& work);

// Refines a coarse choice into fine blocks. `coarse` has num_q_blocks / q_factor rows over
// num_kv_blocks / kv_factor super-blocks (of the fine `contract`); each chosen super-block
// becomes its kv_factor fine blocks in each of its q_factor fine rows, then ApplyCausalWindow
// trims them. Errors: invalid contract; factors < 1 or not dividing the block counts; a coarse
// work set of the wrong shape.
absl::StatusOr<WorkSet> ExpandHierarchical(const MaskContract& contract, const WorkSet& coarse,
                                           int32_t q_factor, int32_t kv_factor);

// OK iff `work` has one row per q block, each row is ascending and unique, every entry is in
// [0, num_kv_blocks) and inside the row's PositionalKvRange, and each row holds its diagonal
// block(s) (so no query token is left without a key). The error names the row and entry.
absl::Status CheckLegality(const MaskContract& contract, const WorkSet& work);

}  // namespace meshrun::worker::sparse
