#include "worker/sparse/block_plan.h"

#include <algorithm>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace meshrun::worker::sparse {

// ---- IndexTable ----

IndexTable::IndexTable(int32_t rows, int32_t cols, uint32_t max_value) : rows_(rows), cols_(cols) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (max_value <= UINT8_MAX) {
    storage_ = std::vector<uint8_t>(n);
  } else if (max_value <= UINT16_MAX) {
    storage_ = std::vector<uint16_t>(n);
  } else {
    storage_ = std::vector<uint32_t>(n);
  }
}

uint32_t IndexTable::at(int32_t row, int32_t col) const {
  const size_t i = static_cast<size_t>(row) * cols_ + col;
  return std::visit([i](const auto& v) { return static_cast<uint32_t>(v[i]); }, storage_);
}

void IndexTable::set(int32_t row, int32_t col, uint32_t value) {
  const size_t i = static_cast<size_t>(row) * cols_ + col;
  std::visit(
      [i, value](auto& v) {
        v[i] = static_cast<typename std::decay_t<decltype(v)>::value_type>(value);
      },
      storage_);
}

size_t IndexTable::element_bytes() const {
  return std::visit([](const auto& v) { return sizeof(v[0]); }, storage_);
}

const void* IndexTable::data() const {
  return std::visit([](const auto& v) { return static_cast<const void*>(v.data()); }, storage_);
}

std::vector<int32_t> IndexTable::ToInt32() const {
  return std::visit([](const auto& v) { return std::vector<int32_t>(v.begin(), v.end()); },
                    storage_);
}

std::vector<int32_t> IndexTable::Row(int32_t row) const {
  std::vector<int32_t> out(cols_);
  for (int32_t c = 0; c < cols_; ++c) out[c] = static_cast<int32_t>(at(row, c));
  return out;
}

// ---- MetadataSizes ----

size_t MetadataSizes::tables() const {
  return block_mask + data_next + mask_next + grid_width + data_next_t + mask_next_t +
         grid_width_t;
}

std::string MetadataSizes::ToString() const {
  return absl::StrCat("block_mask=", block_mask, " data_next=", data_next,
                      " mask_next=", mask_next, " grid_width=", grid_width,
                      " data_next_t=", data_next_t, " mask_next_t=", mask_next_t,
                      " grid_width_t=", grid_width_t, " tables=", tables(),
                      " partial_masks=", partial_masks, " total=", total(), " bytes");
}

MetadataSizes BlockPlan::Sizes() const {
  MetadataSizes s;
  s.block_mask = block_mask.size();
  s.data_next = data_next.size_bytes();
  s.mask_next = mask_next.size_bytes();
  s.grid_width = grid_width.size_bytes();
  s.data_next_t = data_next_t.size_bytes();
  s.mask_next_t = mask_next_t.size_bytes();
  s.grid_width_t = grid_width_t.size_bytes();
  s.partial_masks = partial_masks.size();
  return s;
}

// ---- Planner ----

namespace {

// Per query token, its allowed keys [lo, hi]: the intersection of its document's span and the
// window. Both are non-decreasing in q because doc_ids are.
void ComputeKeyIntervals(const MaskContract& c, absl::Span<const int32_t> doc_ids,
                         std::vector<int32_t>& lo, std::vector<int32_t>& hi) {
  const int32_t n = c.seq_len;
  const int64_t left = c.effective_left();
  const int64_t right = c.effective_right();
  lo.resize(n);
  hi.resize(n);
  int32_t doc_start = 0;
  for (int32_t q = 0; q < n; ++q) {
    if (q > 0 && doc_ids[q] != doc_ids[q - 1]) doc_start = q;
    lo[q] = static_cast<int32_t>(std::max<int64_t>(doc_start, q - left));
  }
  int32_t doc_end = n - 1;
  for (int32_t q = n - 1; q >= 0; --q) {
    if (q < n - 1 && doc_ids[q] != doc_ids[q + 1]) doc_end = q;
    hi[q] = static_cast<int32_t>(std::min<int64_t>(doc_end, q + right));
  }
}

// De-duplicates partial tiles. A tile's mask is fully determined by each row's allowed column
// interval, so the key is those intervals (2 x block_q ints) rather than the block_q x block_kv
// mask bytes. Masks are materialized once, at the end, into an exactly sized buffer.
class PartialMaskInterner {
 public:
  PartialMaskInterner(int32_t block_q, int32_t block_kv)
      : block_q_(block_q), block_kv_(block_kv), key_(2 * block_q) {}

  // lo/hi point at the tile's first query token; k0 is the tile's first key.
  int32_t Intern(const int32_t* lo, const int32_t* hi, int32_t k0) {
    for (int32_t r = 0; r < block_q_; ++r) {
      int32_t a = std::clamp(lo[r] - k0, 0, block_kv_);
      int32_t b = std::clamp(hi[r] + 1 - k0, 0, block_kv_);
      if (b <= a) a = b = 0;  // one spelling for "empty row"
      key_[2 * r] = a;
      key_[2 * r + 1] = b;
    }
    const absl::string_view key(reinterpret_cast<const char*>(key_.data()),
                                key_.size() * sizeof(int32_t));
    if (auto it = index_.find(key); it != index_.end()) return it->second;
    const int32_t index = static_cast<int32_t>(keys_.size());
    index_.emplace(std::string(key), index);
    keys_.push_back(key_);
    return index;
  }
  int32_t size() const { return static_cast<int32_t>(keys_.size()); }

  // Distinct masks in index order, row-major, 1 = attend.
  std::vector<uint8_t> Materialize() const {
    const size_t tile_bytes = static_cast<size_t>(block_q_) * block_kv_;
    std::vector<uint8_t> masks(keys_.size() * tile_bytes, 0);
    for (size_t m = 0; m < keys_.size(); ++m) {
      uint8_t* mask = masks.data() + m * tile_bytes;
      for (int32_t r = 0; r < block_q_; ++r) {
        const int32_t a = keys_[m][2 * r], b = keys_[m][2 * r + 1];
        std::memset(mask + static_cast<size_t>(r) * block_kv_ + a, 1, b - a);
      }
    }
    return masks;
  }

 private:
  const int32_t block_q_;
  const int32_t block_kv_;
  std::vector<int32_t> key_;                        // scratch for the current tile
  absl::flat_hash_map<std::string, int32_t> index_;  // key bytes -> mask index
  std::vector<std::vector<int32_t>> keys_;          // by mask index
};

struct ActiveTile {
  int32_t block;  // kv block in a row list, q block in a column list
  TileClass cls;
  int32_t mask;   // partial-mask index, meaningful for kPartial only
};

// Writes CSR lists (lists[start[r] .. start[r+1])) into fixed-width tables, padding each row
// by repeating its last entry and carrying the last partial-mask index through full tiles.
void FillCompactTables(const std::vector<ActiveTile>& lists, const std::vector<int64_t>& start,
                       IndexTable& data_next, IndexTable& mask_next, IndexTable& grid_width) {
  for (int32_t r = 0; r < data_next.rows(); ++r) {
    const int64_t count = start[r + 1] - start[r];
    uint32_t block = 0;
    uint32_t mask = 0;
    for (int32_t w = 0; w < data_next.cols(); ++w) {
      if (w < count) {
        const ActiveTile& t = lists[start[r] + w];
        block = t.block;
        if (t.cls == TileClass::kPartial) mask = t.mask;
      }
      data_next.set(r, w, block);
      mask_next.set(r, w, mask);
    }
    grid_width.set(r, 0, static_cast<uint32_t>(count));
  }
}

absl::Status WidthError(const char* what, int64_t index, int64_t width, int32_t max_grid_width) {
  return absl::InvalidArgumentError(absl::StrCat(
      "max_grid_width=", max_grid_width, " is too small: ", what, " ", index, " needs ", width,
      " active tiles (the widest); raise max_grid_width to at least ", width,
      " (a new contract, so a recompile) or narrow the mask"));
}

}  // namespace

absl::Status ValidateDocIds(const MaskContract& contract, absl::Span<const int32_t> doc_ids) {
  if (static_cast<int64_t>(doc_ids.size()) != contract.seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat("doc_ids has ", doc_ids.size(), " entries but seq_len=", contract.seq_len,
                     "; pass exactly one document id per token"));
  }
  for (size_t i = 1; i < doc_ids.size(); ++i) {
    if (doc_ids[i] < doc_ids[i - 1]) {
      return absl::InvalidArgumentError(absl::StrCat(
          "doc_ids must be non-decreasing (packed documents are contiguous): doc_ids[", i, "]=",
          doc_ids[i], " follows doc_ids[", i - 1, "]=", doc_ids[i - 1],
          "; number documents in packing order"));
    }
  }
  return absl::OkStatus();
}

PlanBuilder::PlanBuilder(const MaskContract& contract) : contract_(contract) {
  positional_.reserve(contract.num_q_blocks());
  for (int32_t i = 0; i < contract.num_q_blocks(); ++i) {
    positional_.push_back(PositionalKvRange(contract, i));
  }
}

absl::StatusOr<std::unique_ptr<PlanBuilder>> PlanBuilder::Create(const MaskContract& contract) {
  RETURN_IF_ERROR(contract.Validate());
  return std::unique_ptr<PlanBuilder>(new PlanBuilder(contract));
}

absl::StatusOr<BlockPlan> PlanBuilder::Build(absl::Span<const int32_t> doc_ids) const {
  return BuildImpl(doc_ids, nullptr);
}

absl::StatusOr<BlockPlan> PlanBuilder::BuildRouted(absl::Span<const int32_t> doc_ids,
                                                   const WorkSet& work) const {
  RETURN_IF_ERROR(CheckLegality(contract_, work));
  return BuildImpl(doc_ids, &work);
}

absl::StatusOr<BlockPlan> PlanBuilder::BuildImpl(absl::Span<const int32_t> doc_ids,
                                                 const WorkSet* work) const {
  RETURN_IF_ERROR(ValidateDocIds(contract_, doc_ids));
  const MaskContract& c = contract_;
  const int32_t bq = c.block_q;
  const int32_t bkv = c.block_kv;
  const int32_t nq = c.num_q_blocks();
  const int32_t nkv = c.num_kv_blocks();
  const int32_t width = c.max_grid_width;

  std::vector<int32_t> lo, hi;
  ComputeKeyIntervals(c, doc_ids, lo, hi);

  BlockPlan plan;
  plan.contract = c;
  plan.num_q_blocks = nq;
  plan.num_kv_blocks = nkv;
  plan.block_mask.assign(static_cast<size_t>(nq) * nkv, 0);
  PartialMaskInterner interner(bq, bkv);

  // Row lists. The union of a q block's key intervals is the contiguous [lo(q0), hi(q1)]
  // (each interval holds its own query), so exactly the kv blocks meeting it are non-skip;
  // and a tile is full iff the tightest corners cover it: lo(q1) <= k0 and hi(q0) >= k1.
  std::vector<ActiveTile> rows;
  std::vector<int64_t> row_start(nq + 1, 0);
  std::vector<int64_t> col_count(nkv, 0);
  int64_t widest_row = 0, widest_row_index = 0;
  for (int32_t i = 0; i < nq; ++i) {
    const int32_t q0 = i * bq;
    const int32_t q1 = q0 + bq - 1;
    const BlockRange reach{lo[q0] / bkv, hi[q1] / bkv};
    auto visit = [&](int32_t j) {
      const int32_t k0 = j * bkv;
      const int32_t k1 = k0 + bkv - 1;
      ActiveTile t{j, TileClass::kFull, 0};
      if (!(lo[q1] <= k0 && hi[q0] >= k1)) {
        t.cls = TileClass::kPartial;
        t.mask = interner.Intern(&lo[q0], &hi[q0], k0);
      }
      plan.block_mask[static_cast<size_t>(i) * nkv + j] = static_cast<uint8_t>(t.cls);
      ++col_count[j];
      rows.push_back(t);
    };
    if (work != nullptr) {
      for (int32_t j : work->rows[i]) {
        if (reach.contains(j)) visit(j);
      }
    } else {
      for (int32_t j = reach.first; j <= reach.last; ++j) visit(j);
    }
    row_start[i + 1] = static_cast<int64_t>(rows.size());
    if (row_start[i + 1] - row_start[i] > widest_row) {
      widest_row = row_start[i + 1] - row_start[i];
      widest_row_index = i;
    }
  }
  if (widest_row > width) {
    return WidthError("q-block row", widest_row_index, widest_row, width);
  }
  const auto widest_col = std::max_element(col_count.begin(), col_count.end());
  if (*widest_col > width) {
    return WidthError("kv-block column (backward tables)", widest_col - col_count.begin(),
                      *widest_col, width);
  }

  // Column lists for the backward pass, by counting sort over the row lists (rows ascend, so
  // each column's q blocks come out ascending).
  std::vector<int64_t> col_start(nkv + 1, 0);
  for (int32_t j = 0; j < nkv; ++j) col_start[j + 1] = col_start[j] + col_count[j];
  std::vector<ActiveTile> cols(rows.size());
  std::vector<int64_t> cursor(col_start.begin(), col_start.end() - 1);
  for (int32_t i = 0; i < nq; ++i) {
    for (int64_t e = row_start[i]; e < row_start[i + 1]; ++e) {
      cols[cursor[rows[e].block]++] = ActiveTile{i, rows[e].cls, rows[e].mask};
    }
  }

  // Each distinct mask belongs to an active tile, and there are at most min(nq, nkv) x width.
  const uint32_t mask_bound = static_cast<uint32_t>(
      std::min<uint64_t>(uint64_t(std::min(nq, nkv)) * width - 1, UINT32_MAX));
  plan.active_tiles = static_cast<int64_t>(rows.size());
  plan.num_partial_masks = interner.size();
  plan.partial_masks = interner.Materialize();
  plan.data_next = IndexTable(nq, width, nkv - 1);
  plan.mask_next = IndexTable(nq, width, mask_bound);
  plan.grid_width = IndexTable(nq, 1, width);
  plan.data_next_t = IndexTable(nkv, width, nq - 1);
  plan.mask_next_t = IndexTable(nkv, width, mask_bound);
  plan.grid_width_t = IndexTable(nkv, 1, width);
  FillCompactTables(rows, row_start, plan.data_next, plan.mask_next, plan.grid_width);
  FillCompactTables(cols, col_start, plan.data_next_t, plan.mask_next_t, plan.grid_width_t);
  return plan;
}

absl::StatusOr<BlockPlan> BuildBlockPlan(const MaskContract& contract,
                                         absl::Span<const int32_t> doc_ids) {
  ASSIGN_OR_RETURN(std::unique_ptr<PlanBuilder> builder, PlanBuilder::Create(contract));
  return builder->Build(doc_ids);
}

}  // namespace meshrun::worker::sparse
