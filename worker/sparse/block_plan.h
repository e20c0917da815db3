// Block-sparse attention plan: fixed-shape tables that tell a tiled attention kernel which
// (q block, kv block) tiles to visit and which token mask each visited tile needs.
//
// Semantics: token q may attend token k iff doc_ids[q] == doc_ids[k] and
// -effective_left <= k - q <= effective_right (see MaskContract). doc_ids are non-decreasing
// (packed documents), so each query token's allowed keys form one contiguous interval
// [lo(q), hi(q)] with lo and hi non-decreasing in q. The planner classifies every tile from
// those intervals at the tile corners in O(1) and materializes token masks only for partial
// tiles, de-duplicated by their per-row intervals: O(tiles + partial work), never O(N^2).
//
// Index storage (IndexTable): each index table uses the narrowest unsigned type (uint8,
// uint16 or uint32) that holds its largest possible value, derived from the contract alone
// (num_kv_blocks - 1, num_q_blocks - 1, max_grid_width, or the partial-mask bound
// min(nq, nkv) x max_grid_width), so the element types never change with doc_ids.
// block_mask is uint8. The number of partial masks does change with doc_ids; a consumer that
// needs a fixed shape pads partial_masks to its own capacity.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "worker/sparse/mask_contract.h"
#include "worker/sparse/planner_stages.h"

namespace meshrun::worker::sparse {

enum class TileClass : uint8_t { kSkip = 0, kPartial = 1, kFull = 2 };

// Row-major [rows x cols] table of non-negative indices in the narrowest unsigned type that
// holds `max_value`. Value type; not synchronized.
class IndexTable {
 public:
  IndexTable() = default;
  IndexTable(int32_t rows, int32_t cols, uint32_t max_value);

  int32_t rows() const { return rows_; }
  int32_t cols() const { return cols_; }
  uint32_t at(int32_t row, int32_t col) const;
  void set(int32_t row, int32_t col, uint32_t value);  // value <= the constructor's max_value
  size_t element_bytes() const;  // 1, 2 or 4
  size_t size_bytes() const { return element_bytes() * rows_ * cols_; }
  const void* data() const;
  std::vector<int32_t> ToInt32() const;  // widened copy, e.g. for an int32 scalar-prefetch
  std::vector<int32_t> Row(int32_t row) const;

 private:
  int32_t rows_ = 0;
  int32_t cols_ = 0;
  std::variant<std::vector<uint8_t>, std::vector<uint16_t>, std::vector<uint32_t>> storage_;
};

// Bytes of each table, for one plan (shared by contract.heads_per_plan heads).
struct MetadataSizes {
  size_t block_mask = 0;
  size_t data_next = 0, mask_next = 0, grid_width = 0;
  size_t data_next_t = 0, mask_next_t = 0, grid_width_t = 0;
  size_t partial_masks = 0;

  size_t tables() const;  // everything except partial_masks
  size_t total() const { return tables() + partial_masks; }
  std::string ToString() const;
};

struct BlockPlan {
  MaskContract contract;
  int32_t num_q_blocks = 0;
  int32_t num_kv_blocks = 0;
  int64_t active_tiles = 0;  // partial + full

  // [nq x nkv] TileClass values.
  std::vector<uint8_t> block_mask;
  // Forward, per q block row, W = max_grid_width columns: the non-skipped kv blocks in
  // ascending order, padded by repeating the last one (so a pipelined kernel fetches nothing
  // new in padding steps).
  IndexTable data_next;
  // Same shape: index into partial_masks where the tile is partial; elsewhere (full tiles,
  // padding) it repeats the previous entry (0 before the first partial tile), for the same
  // reason. Consult block_mask[row][data_next] before using it.
  IndexTable mask_next;
  IndexTable grid_width;  // [nq x 1]: active tiles in the row
  // Backward (dK/dV), per kv block column: the q blocks touching it, same conventions.
  IndexTable data_next_t;   // [nkv x W]
  IndexTable mask_next_t;   // [nkv x W], indices into the same partial_masks
  IndexTable grid_width_t;  // [nkv x 1]
  // Distinct [block_q x block_kv] token masks (1 = attend), row-major, concatenated.
  int32_t num_partial_masks = 0;
  std::vector<uint8_t> partial_masks;

  TileClass tile(int32_t q_block, int32_t kv_block) const {
    return static_cast<TileClass>(block_mask[int64_t{q_block} * num_kv_blocks + kv_block]);
  }
  const uint8_t* partial_mask(int32_t index) const {
    return partial_masks.data() + int64_t{index} * contract.block_q * contract.block_kv;
  }
  MetadataSizes Sizes() const;
};

// Builds plans for one contract. Create() does the doc-independent precomputation once; the
// builder is immutable afterwards, so Build*() may run concurrently from any thread.
// The returned plans own their data.
class PlanBuilder {
 public:
  // InvalidArgument if contract.Validate() fails.
  static absl::StatusOr<std::unique_ptr<PlanBuilder>> Create(const MaskContract& contract);

  const MaskContract& contract() const { return contract_; }
  // Per q block: the kv blocks causal + window allow (ignoring documents).
  const std::vector<BlockRange>& positional_kv_ranges() const { return positional_; }

  // Every tile the mask allows. InvalidArgument if doc_ids has the wrong length or decreases,
  // or if a row (column) needs more than max_grid_width tiles (the message names the needed
  // width).
  absl::StatusOr<BlockPlan> Build(absl::Span<const int32_t> doc_ids) const;

  // Only the tiles of `work` the mask allows (routed attention). Same errors as Build, plus
  // any CheckLegality error of `work`.
  absl::StatusOr<BlockPlan> BuildRouted(absl::Span<const int32_t> doc_ids,
                                        const WorkSet& work) const;

 private:
  explicit PlanBuilder(const MaskContract& contract);
  absl::StatusOr<BlockPlan> BuildImpl(absl::Span<const int32_t> doc_ids,
                                      const WorkSet* work) const;

  MaskContract contract_;
  std::vector<BlockRange> positional_;
};

// One-shot convenience: PlanBuilder::Create(contract) then Build(doc_ids).
absl::StatusOr<BlockPlan> BuildBlockPlan(const MaskContract& contract,
                                         absl::Span<const int32_t> doc_ids);

// Checks doc_ids against the contract: InvalidArgument naming the field and the fix if the
// length is not seq_len or an entry is below its predecessor.
absl::Status ValidateDocIds(const MaskContract& contract, absl::Span<const int32_t> doc_ids);

}  // namespace meshrun::worker::sparse
