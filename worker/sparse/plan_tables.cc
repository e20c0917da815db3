#include "worker/sparse/plan_tables.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace meshrun::worker::sparse {
namespace {

constexpr PlanTable kTables[] = {PlanTable::kBlockMask, PlanTable::kDataNext,
                                 PlanTable::kMaskNext, PlanTable::kGridWidth,
                                 PlanTable::kPartialMasks};

// IndexTable's rule: the narrowest unsigned type holding max_value.
int64_t IndexBytes(uint64_t max_value) {
  return max_value <= UINT8_MAX ? 1 : max_value <= UINT16_MAX ? 2 : 4;
}

absl::Status CopyIndexTable(const IndexTable& table, int64_t expected_bytes, const char* name,
                            char* row) {
  if (static_cast<int64_t>(table.element_bytes()) != expected_bytes) {
    return absl::InternalError(absl::StrCat(name, " has ", table.element_bytes(),
                                            "-byte entries but the layout wants ", expected_bytes,
                                            ": the plan was built for another contract"));
  }
  std::memcpy(row, table.data(), table.size_bytes());
  return absl::OkStatus();
}

}  // namespace

const char* PlanTableName(PlanTable table) {
  switch (table) {
    case PlanTable::kBlockMask: return "block_mask";
    case PlanTable::kDataNext: return "data_next";
    case PlanTable::kMaskNext: return "mask_next";
    case PlanTable::kGridWidth: return "grid_width";
    case PlanTable::kPartialMasks: return "partial_masks";
  }
  return "unknown";
}

absl::StatusOr<PlanTable> ParsePlanTable(absl::string_view name) {
  for (PlanTable t : kTables) {
    if (name == PlanTableName(t)) return t;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "plan table \"", name,
      "\" is not block_mask, data_next, mask_next, grid_width or partial_masks"));
}

int64_t TableLayout::row_bytes() const {
  int64_t n = element_bytes;
  for (size_t i = 1; i < dims.size(); ++i) n *= dims[i];
  return n;
}

TableLayout LayoutOf(const MaskContract& c, PlanTable table, int64_t rows) {
  const int64_t nq = c.num_q_blocks(), nkv = c.num_kv_blocks(), w = c.max_grid_width;
  const int64_t capacity = std::min(nq, nkv) * w;
  TableLayout layout;
  switch (table) {
    case PlanTable::kBlockMask: layout.dims = {rows, nq, nkv}; break;
    case PlanTable::kDataNext:
      layout.dims = {rows, nq, w};
      layout.element_bytes = IndexBytes(nkv - 1);
      break;
    case PlanTable::kMaskNext:
      layout.dims = {rows, nq, w};
      layout.element_bytes = IndexBytes(capacity - 1);
      break;
    case PlanTable::kGridWidth:
      layout.dims = {rows, nq, 1};
      layout.element_bytes = IndexBytes(w);
      break;
    case PlanTable::kPartialMasks: layout.dims = {rows, capacity, c.block_q, c.block_kv}; break;
  }
  layout.dtype = absl::StrCat("u", 8 * layout.element_bytes);
  return layout;
}

absl::Status WriteTableRow(const BlockPlan& plan, PlanTable table, char* row) {
  const TableLayout layout = LayoutOf(plan.contract, table, 1);
  switch (table) {
    case PlanTable::kBlockMask:
      std::memcpy(row, plan.block_mask.data(), plan.block_mask.size());
      return absl::OkStatus();
    case PlanTable::kDataNext:
      return CopyIndexTable(plan.data_next, layout.element_bytes, "data_next", row);
    case PlanTable::kMaskNext:
      return CopyIndexTable(plan.mask_next, layout.element_bytes, "mask_next", row);
    case PlanTable::kGridWidth:
      return CopyIndexTable(plan.grid_width, layout.element_bytes, "grid_width", row);
    case PlanTable::kPartialMasks: {
      const size_t used = plan.partial_masks.size();
      if (static_cast<int64_t>(used) > layout.row_bytes()) {
        return absl::InternalError("more partial masks than min(nq, nkv) * max_grid_width");
      }
      std::memcpy(row, plan.partial_masks.data(), used);
      std::memset(row + used, 0, layout.row_bytes() - used);  // at most C masks exist
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown plan table");
}

}  // namespace meshrun::worker::sparse
