// Test-only helpers for worker/sparse: the dense reference mask, plan expansion back to
// tokens, and random packed documents. Not part of the library.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/sparse/block_plan.h"

// Debian 12's GTest package has no gmock, hence a plain substring check.
#define EXPECT_HAS_SUBSTR(text, needle)                                              \
  EXPECT_TRUE(absl::StrContains(text, needle)) << "\"" << (text) << "\" lacks \"" \
                                               << (needle) << "\""

namespace meshrun::worker::sparse::testing {

// [seq_len x seq_len] token mask straight from the predicate, O(N^2).
inline std::vector<uint8_t> ReferenceTokenMask(const MaskContract& c,
                                               const std::vector<int32_t>& doc_ids) {
  const int64_t n = c.seq_len;
  std::vector<uint8_t> mask(n * n);
  for (int64_t q = 0; q < n; ++q) {
    for (int64_t k = 0; k < n; ++k) {
      mask[q * n + k] = TokenAllowed(c.effective_left(), c.effective_right(), doc_ids[q],
                                     doc_ids[k], q, k);
    }
  }
  return mask;
}

// Paints one tile of a token mask: full -> all 1, partial -> its partial mask.
inline void PaintTile(const BlockPlan& plan, int32_t qb, int32_t kb, uint32_t mask_index,
                      std::vector<uint8_t>& out) {
  const MaskContract& c = plan.contract;
  const TileClass cls = plan.tile(qb, kb);
  ASSERT_NE(cls, TileClass::kSkip) << "compact table lists skipped tile " << qb << "," << kb;
  if (cls == TileClass::kPartial) {
    ASSERT_LT(mask_index, static_cast<uint32_t>(plan.num_partial_masks));
  }
  for (int32_t r = 0; r < c.block_q; ++r) {
    for (int32_t col = 0; col < c.block_kv; ++col) {
      const int64_t q = int64_t{qb} * c.block_q + r;
      const int64_t k = int64_t{kb} * c.block_kv + col;
      uint8_t& cell = out[q * c.seq_len + k];
      ASSERT_EQ(cell, 0) << "tile " << qb << "," << kb << " painted twice";
      cell = cls == TileClass::kFull
                 ? 1
                 : plan.partial_mask(static_cast<int32_t>(mask_index))[r * c.block_kv + col];
    }
  }
}

// Token mask the forward tables describe (data_next / mask_next / grid_width); tiles the
// tables do not list are "skip" and contribute nothing.
inline std::vector<uint8_t> ExpandForward(const BlockPlan& plan) {
  std::vector<uint8_t> out(int64_t{plan.contract.seq_len} * plan.contract.seq_len, 0);
  for (int32_t i = 0; i < plan.num_q_blocks; ++i) {
    for (uint32_t w = 0; w < plan.grid_width.at(i, 0); ++w) {
      PaintTile(plan, i, static_cast<int32_t>(plan.data_next.at(i, w)), plan.mask_next.at(i, w),
                out);
    }
  }
  return out;
}

// Same from the transposed (backward) tables.
inline std::vector<uint8_t> ExpandBackward(const BlockPlan& plan) {
  std::vector<uint8_t> out(int64_t{plan.contract.seq_len} * plan.contract.seq_len, 0);
  for (int32_t j = 0; j < plan.num_kv_blocks; ++j) {
    for (uint32_t w = 0; w < plan.grid_width_t.at(j, 0); ++w) {
      PaintTile(plan, static_cast<int32_t>(plan.data_next_t.at(j, w)), j,
                plan.mask_next_t.at(j, w), out);
    }
  }
  return out;
}

// Packed documents: non-decreasing ids, lengths in [1, max_len], ids may skip values.
inline std::vector<int32_t> RandomDocIds(int32_t n, int32_t max_len, std::mt19937& rng) {
  std::vector<int32_t> ids(n);
  std::uniform_int_distribution<int32_t> len(1, max_len);
  std::uniform_int_distribution<int32_t> gap(1, 3);
  int32_t doc = 0;
  for (int32_t pos = 0; pos < n;) {
    const int32_t end = std::min(n, pos + len(rng));
    for (; pos < end; ++pos) ids[pos] = doc;
    doc += gap(rng);
  }
  return ids;
}

}  // namespace meshrun::worker::sparse::testing
