#include "worker/sparse/block_plan.h"

#include <cstdio>
#include <random>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "worker/sparse/planner_stages.h"
#include "worker/sparse/test_util.h"

namespace meshrun::worker::sparse {
namespace {

using testing::ExpandBackward;
using testing::ExpandForward;
using testing::RandomDocIds;
using testing::ReferenceTokenMask;
using Rows = std::vector<std::vector<int32_t>>;

MaskContract Contract(int32_t seq_len, int32_t block, int32_t width, bool causal = true) {
  MaskContract c;
  c.seq_len = seq_len;
  c.causal = causal;
  c.block_q = block;
  c.block_kv = block;
  c.max_grid_width = width;
  return c;
}

Rows BlockMaskRows(const BlockPlan& p) {
  Rows rows(p.num_q_blocks);
  for (int32_t i = 0; i < p.num_q_blocks; ++i) {
    for (int32_t j = 0; j < p.num_kv_blocks; ++j) {
      rows[i].push_back(p.block_mask[i * p.num_kv_blocks + j]);
    }
  }
  return rows;
}

Rows TableRows(const IndexTable& t) {
  Rows rows;
  for (int32_t r = 0; r < t.rows(); ++r) rows.push_back(t.Row(r));
  return rows;
}

std::vector<int32_t> Column(const IndexTable& t) {
  std::vector<int32_t> out;
  for (int32_t r = 0; r < t.rows(); ++r) out.push_back(static_cast<int32_t>(t.at(r, 0)));
  return out;
}

// Partial mask `index` as rows of 0/1.
Rows MaskRows(const BlockPlan& p, int32_t index) {
  Rows rows(p.contract.block_q, std::vector<int32_t>(p.contract.block_kv));
  for (int32_t r = 0; r < p.contract.block_q; ++r) {
    for (int32_t c = 0; c < p.contract.block_kv; ++c) {
      rows[r][c] = p.partial_mask(index)[r * p.contract.block_kv + c];
    }
  }
  return rows;
}

template <typename Pred>
Rows MaskFrom(int32_t bq, int32_t bkv, Pred allowed) {
  Rows rows(bq, std::vector<int32_t>(bkv));
  for (int32_t r = 0; r < bq; ++r) {
    for (int32_t c = 0; c < bkv; ++c) rows[r][c] = allowed(r, c) ? 1 : 0;
  }
  return rows;
}

// ---- Golden tables, worked out by hand ----

TEST(BlockPlanGoldenTest, Causal64TokensBlocks16) {
  const std::vector<int32_t> one_doc(64, 0);
  auto plan = BuildBlockPlan(Contract(64, 16, 4), one_doc);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(BlockMaskRows(*plan), (Rows{{1, 0, 0, 0}, {2, 1, 0, 0}, {2, 2, 1, 0}, {2, 2, 2, 1}}));
  EXPECT_EQ(TableRows(plan->data_next),
            (Rows{{0, 0, 0, 0}, {0, 1, 1, 1}, {0, 1, 2, 2}, {0, 1, 2, 3}}));
  EXPECT_EQ(Column(plan->grid_width), (std::vector<int32_t>{1, 2, 3, 4}));
  // One distinct partial mask (the diagonal's lower triangle), so every mask_next is 0.
  ASSERT_EQ(plan->num_partial_masks, 1);
  EXPECT_EQ(MaskRows(*plan, 0), MaskFrom(16, 16, [](int r, int c) { return c <= r; }));
  EXPECT_EQ(TableRows(plan->mask_next), Rows(4, std::vector<int32_t>(4, 0)));
  // Backward: per kv block, the q blocks at or below the diagonal.
  EXPECT_EQ(TableRows(plan->data_next_t),
            (Rows{{0, 1, 2, 3}, {1, 2, 3, 3}, {2, 3, 3, 3}, {3, 3, 3, 3}}));
  EXPECT_EQ(Column(plan->grid_width_t), (std::vector<int32_t>{4, 3, 2, 1}));
  EXPECT_EQ(TableRows(plan->mask_next_t), Rows(4, std::vector<int32_t>(4, 0)));
  EXPECT_EQ(plan->active_tiles, 10);
  EXPECT_EQ(plan->data_next.element_bytes(), 1u);
}

TEST(BlockPlanGoldenTest, CausalPackedDocuments) {
  // Document 0 = tokens [0, 40), document 1 = [40, 64): the boundary cuts q/kv block 2.
  std::vector<int32_t> doc_ids(64, 0);
  for (int t = 40; t < 64; ++t) doc_ids[t] = 1;
  auto plan = BuildBlockPlan(Contract(64, 16, 4), doc_ids);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(BlockMaskRows(*plan), (Rows{{1, 0, 0, 0}, {2, 1, 0, 0}, {1, 1, 1, 0}, {0, 0, 1, 1}}));
  EXPECT_EQ(TableRows(plan->data_next),
            (Rows{{0, 0, 0, 0}, {0, 1, 1, 1}, {0, 1, 2, 2}, {2, 3, 3, 3}}));
  EXPECT_EQ(Column(plan->grid_width), (std::vector<int32_t>{1, 2, 3, 2}));
  // Masks in discovery order (row-major): 0 causal triangle; 1 (2,0)=(2,1): doc-0 queries
  // (rows 0..7) see everything, doc-1 queries nothing; 2 the split diagonal (2,2); 3 (3,2):
  // doc-1 keys only (columns 8..15).
  ASSERT_EQ(plan->num_partial_masks, 4);
  EXPECT_EQ(MaskRows(*plan, 0), MaskFrom(16, 16, [](int r, int c) { return c <= r; }));
  EXPECT_EQ(MaskRows(*plan, 1), MaskFrom(16, 16, [](int r, int c) { return r < 8; }));
  EXPECT_EQ(MaskRows(*plan, 2), MaskFrom(16, 16, [](int r, int c) {
              return c <= r && (r < 8) == (c < 8);
            }));
  EXPECT_EQ(MaskRows(*plan, 3), MaskFrom(16, 16, [](int r, int c) { return c >= 8; }));
  // Full tile (1,0) carries the previous index (0); padding repeats the last entry.
  EXPECT_EQ(TableRows(plan->mask_next),
            (Rows{{0, 0, 0, 0}, {0, 0, 0, 0}, {1, 1, 2, 2}, {3, 0, 0, 0}}));
  EXPECT_EQ(TableRows(plan->data_next_t),
            (Rows{{0, 1, 2, 2}, {1, 2, 2, 2}, {2, 3, 3, 3}, {3, 3, 3, 3}}));
  EXPECT_EQ(Column(plan->grid_width_t), (std::vector<int32_t>{3, 2, 2, 1}));
  EXPECT_EQ(TableRows(plan->mask_next_t),
            (Rows{{0, 0, 1, 1}, {0, 1, 1, 1}, {2, 3, 3, 3}, {0, 0, 0, 0}}));
}

TEST(BlockPlanGoldenTest, CausalSlidingWindow) {
  // 128 tokens, 16-token blocks, k in [q - 32, q]: each row sees blocks i-2 (partial, upper
  // triangle), i-1 (full) and i (diagonal, lower triangle).
  MaskContract c = Contract(128, 16, 3);
  c.window = LocalWindow{32, 0};
  auto plan = BuildBlockPlan(c, std::vector<int32_t>(128, 7));
  ASSERT_TRUE(plan.ok()) << plan.status();
  Rows block_mask(8, std::vector<int32_t>(8, 0));
  Rows data_next, mask_next;
  for (int i = 0; i < 8; ++i) {
    block_mask[i][i] = 1;
    if (i >= 1) block_mask[i][i - 1] = 2;
    if (i >= 2) block_mask[i][i - 2] = 1;
  }
  EXPECT_EQ(BlockMaskRows(*plan), block_mask);
  data_next = {{0, 0, 0}, {0, 1, 1}};
  mask_next = {{0, 0, 0}, {0, 0, 0}};
  for (int i = 2; i < 8; ++i) {
    data_next.push_back({i - 2, i - 1, i});
    mask_next.push_back({1, 1, 0});
  }
  EXPECT_EQ(TableRows(plan->data_next), data_next);
  EXPECT_EQ(TableRows(plan->mask_next), mask_next);
  EXPECT_EQ(Column(plan->grid_width), (std::vector<int32_t>{1, 2, 3, 3, 3, 3, 3, 3}));
  ASSERT_EQ(plan->num_partial_masks, 2);
  EXPECT_EQ(MaskRows(*plan, 0), MaskFrom(16, 16, [](int r, int c) { return c <= r; }));
  EXPECT_EQ(MaskRows(*plan, 1), MaskFrom(16, 16, [](int r, int c) { return c >= r; }));
  Rows data_next_t, mask_next_t;
  for (int j = 0; j < 6; ++j) {
    data_next_t.push_back({j, j + 1, j + 2});
    mask_next_t.push_back({0, 0, 1});
  }
  data_next_t.push_back({6, 7, 7});
  data_next_t.push_back({7, 7, 7});
  mask_next_t.push_back({0, 0, 0});
  mask_next_t.push_back({0, 0, 0});
  EXPECT_EQ(TableRows(plan->data_next_t), data_next_t);
  EXPECT_EQ(TableRows(plan->mask_next_t), mask_next_t);
  EXPECT_EQ(Column(plan->grid_width_t), (std::vector<int32_t>{3, 3, 3, 3, 3, 3, 2, 1}));
}

TEST(BlockPlanGoldenTest, BidirectionalWindowRectangularBlocks) {
  // 32 tokens, 8-token q blocks x 4-token kv blocks, |k - q| <= 8, one document.
  // Row i (tokens 8i..8i+7) reaches keys [8i-8, 8i+15]: kv blocks 2i-2 .. 2i+3 (clamped).
  // Full iff lo(q1) = 8i-1 <= k0 and hi(q0) = 8i+8 >= k1: blocks 2i and 2i+1 (row 0 and row 3
  // gain full edge blocks because the sequence ends clip the window).
  MaskContract c = Contract(32, 8, 6, /*causal=*/false);
  c.block_kv = 4;
  c.window = LocalWindow{8, 8};
  auto plan = BuildBlockPlan(c, std::vector<int32_t>(32, 0));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(BlockMaskRows(*plan), (Rows{{2, 2, 1, 1, 0, 0, 0, 0},
                                        {1, 1, 2, 2, 1, 1, 0, 0},
                                        {0, 0, 1, 1, 2, 2, 1, 1},
                                        {0, 0, 0, 0, 1, 1, 2, 2}}));
  EXPECT_EQ(TableRows(plan->data_next), (Rows{{0, 1, 2, 3, 3, 3},
                                             {0, 1, 2, 3, 4, 5},
                                             {2, 3, 4, 5, 6, 7},
                                             {4, 5, 6, 7, 7, 7}}));
  EXPECT_EQ(Column(plan->grid_width), (std::vector<int32_t>{4, 6, 6, 4}));
  // Discovery order: 0 = c <= r (right edge), 1 = c <= r-4 (far right), 2 = c >= r (left
  // edge), 3 = c >= r-4 (near left).
  ASSERT_EQ(plan->num_partial_masks, 4);
  EXPECT_EQ(MaskRows(*plan, 0), MaskFrom(8, 4, [](int r, int c) { return c <= r; }));
  EXPECT_EQ(MaskRows(*plan, 1), MaskFrom(8, 4, [](int r, int c) { return c <= r - 4; }));
  EXPECT_EQ(MaskRows(*plan, 2), MaskFrom(8, 4, [](int r, int c) { return c >= r; }));
  EXPECT_EQ(MaskRows(*plan, 3), MaskFrom(8, 4, [](int r, int c) { return c >= r - 4; }));
  EXPECT_EQ(TableRows(plan->mask_next), (Rows{{0, 0, 0, 1, 1, 1},
                                             {2, 3, 3, 3, 0, 1},
                                             {2, 3, 3, 3, 0, 1},
                                             {2, 3, 3, 3, 3, 3}}));
  EXPECT_EQ(TableRows(plan->data_next_t), (Rows{{0, 1, 1, 1, 1, 1},
                                               {0, 1, 1, 1, 1, 1},
                                               {0, 1, 2, 2, 2, 2},
                                               {0, 1, 2, 2, 2, 2},
                                               {1, 2, 3, 3, 3, 3},
                                               {1, 2, 3, 3, 3, 3},
                                               {2, 3, 3, 3, 3, 3},
                                               {2, 3, 3, 3, 3, 3}}));
  EXPECT_EQ(TableRows(plan->mask_next_t), (Rows{{0, 2, 2, 2, 2, 2},
                                               {0, 3, 3, 3, 3, 3},
                                               {0, 0, 2, 2, 2, 2},
                                               {1, 1, 3, 3, 3, 3},
                                               {0, 0, 2, 2, 2, 2},
                                               {1, 1, 3, 3, 3, 3},
                                               {0, 0, 0, 0, 0, 0},
                                               {1, 1, 1, 1, 1, 1}}));
  EXPECT_EQ(Column(plan->grid_width_t), (std::vector<int32_t>{2, 2, 3, 3, 3, 3, 2, 2}));
}

// ---- Errors ----

TEST(BlockPlanErrorTest, RowWiderThanMaxGridWidth) {
  auto plan = BuildBlockPlan(Contract(64, 16, 3), std::vector<int32_t>(64, 0));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(plan.status().message(), "max_grid_width=3 is too small");
  EXPECT_HAS_SUBSTR(plan.status().message(), "q-block row 3 needs 4 active tiles");
  EXPECT_HAS_SUBSTR(plan.status().message(), "at least 4");
}

TEST(BlockPlanErrorTest, ColumnWiderThanMaxGridWidth) {
  // 16-token q blocks, 32-token kv blocks: rows hold <= 2 tiles, kv column 0 holds 4.
  MaskContract c = Contract(64, 16, 2);
  c.block_kv = 32;
  auto plan = BuildBlockPlan(c, std::vector<int32_t>(64, 0));
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(plan.status().message(), "kv-block column (backward tables) 0 needs 4");
}

TEST(BlockPlanErrorTest, PackedDocumentsNarrowTheGrid) {
  // Same contract that fails for one document fits once documents cut the rows short.
  std::vector<int32_t> doc_ids(64, 0);
  for (int t = 32; t < 64; ++t) doc_ids[t] = 1;
  EXPECT_TRUE(BuildBlockPlan(Contract(64, 16, 3), doc_ids).ok());
}

TEST(BlockPlanErrorTest, BadDocIds) {
  auto short_ids = BuildBlockPlan(Contract(64, 16, 4), std::vector<int32_t>(63, 0));
  ASSERT_EQ(short_ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(short_ids.status().message(), "doc_ids has 63 entries but seq_len=64");
  EXPECT_HAS_SUBSTR(short_ids.status().message(), "one document id per token");

  std::vector<int32_t> decreasing(64, 2);
  decreasing[17] = 1;
  auto plan = BuildBlockPlan(Contract(64, 16, 4), decreasing);
  ASSERT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(plan.status().message(), "doc_ids[17]=1 follows doc_ids[16]=2");
  EXPECT_HAS_SUBSTR(plan.status().message(), "number documents in packing order");
}

TEST(BlockPlanErrorTest, InvalidContract) {
  MaskContract c = Contract(64, 16, 4);
  c.block_q = 12;
  EXPECT_EQ(PlanBuilder::Create(c).status().code(), absl::StatusCode::kInvalidArgument);
}

// ---- Properties ----

struct RandomCase {
  MaskContract contract;
  std::vector<int32_t> doc_ids;
};

RandomCase MakeRandomCase(std::mt19937& rng) {
  static constexpr int32_t kBlocks[] = {1, 2, 4, 8, 16};
  auto pick = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  RandomCase rc;
  MaskContract& c = rc.contract;
  c.block_q = kBlocks[pick(0, 4)];
  c.block_kv = kBlocks[pick(0, 4)];
  const int32_t unit = std::max(c.block_q, c.block_kv);
  c.seq_len = unit * pick(1, std::max(1, 96 / unit));
  c.causal = pick(0, 1) == 1;
  if (pick(0, 2) > 0) c.window = LocalWindow{pick(0, c.seq_len - 1), pick(0, c.seq_len - 1)};
  c.max_grid_width = std::max(c.num_q_blocks(), c.num_kv_blocks());
  static constexpr int32_t kDocLen[] = {1, 3, 10, 40, 1000};
  rc.doc_ids = RandomDocIds(c.seq_len, kDocLen[pick(0, 4)], rng);
  return rc;
}

TEST(BlockPlanPropertyTest, TilesReproduceTheDenseTokenMask) {
  std::mt19937 rng(20240607);
  for (int iter = 0; iter < 400; ++iter) {
    const RandomCase rc = MakeRandomCase(rng);
    const MaskContract& c = rc.contract;
    SCOPED_TRACE(c.ToString());
    auto plan = BuildBlockPlan(c, rc.doc_ids);
    ASSERT_TRUE(plan.ok()) << plan.status();
    const std::vector<uint8_t> reference = ReferenceTokenMask(c, rc.doc_ids);
    ASSERT_EQ(ExpandForward(*plan), reference);
    ASSERT_EQ(ExpandBackward(*plan), reference);

    // Classification is exact: skip = no allowed pair, full = all pairs allowed.
    int64_t active = 0;
    for (int32_t i = 0; i < plan->num_q_blocks; ++i) {
      for (int32_t j = 0; j < plan->num_kv_blocks; ++j) {
        int64_t allowed = 0;
        for (int32_t r = 0; r < c.block_q; ++r) {
          for (int32_t k = 0; k < c.block_kv; ++k) {
            allowed += reference[(int64_t{i} * c.block_q + r) * c.seq_len + j * c.block_kv + k];
          }
        }
        const TileClass expected = allowed == 0 ? TileClass::kSkip
                                   : allowed == int64_t{c.block_q} * c.block_kv
                                       ? TileClass::kFull
                                       : TileClass::kPartial;
        ASSERT_EQ(plan->tile(i, j), expected) << "tile " << i << "," << j;
        active += expected != TileClass::kSkip;
      }
    }
    ASSERT_EQ(plan->active_tiles, active);

    // Partial masks are distinct, and padding repeats the last entry.
    absl::flat_hash_set<std::string> distinct;
    const size_t tile_bytes = size_t(c.block_q) * c.block_kv;
    for (int32_t m = 0; m < plan->num_partial_masks; ++m) {
      distinct.emplace(reinterpret_cast<const char*>(plan->partial_mask(m)), tile_bytes);
    }
    ASSERT_EQ(distinct.size(), size_t(plan->num_partial_masks));
    for (int32_t i = 0; i < plan->num_q_blocks; ++i) {
      const uint32_t width = plan->grid_width.at(i, 0);
      ASSERT_GE(width, 1u) << "every query row attends at least itself";
      for (int32_t w = width; w < c.max_grid_width; ++w) {
        ASSERT_EQ(plan->data_next.at(i, w), plan->data_next.at(i, width - 1));
        ASSERT_EQ(plan->mask_next.at(i, w), plan->mask_next.at(i, width - 1));
      }
    }
  }
}

TEST(BlockPlanPropertyTest, RoutedPlanKeepsOnlySelectedTiles) {
  std::mt19937 rng(7);
  for (int iter = 0; iter < 150; ++iter) {
    RandomCase rc = MakeRandomCase(rng);
    MaskContract& c = rc.contract;
    c.heads_per_plan = std::uniform_int_distribution<int32_t>(1, 3)(rng);
    SCOPED_TRACE(c.ToString());
    std::vector<float> scores(size_t(c.heads_per_plan) * c.num_q_blocks() * c.num_kv_blocks());
    std::uniform_real_distribution<float> score(-1, 1);
    for (float& s : scores) s = score(rng);
    int32_t widest = 0;
    for (int32_t i = 0; i < c.num_q_blocks(); ++i) {
      widest = std::max(widest, PositionalKvRange(c, i).size());
    }
    const int32_t top_k = std::uniform_int_distribution<int32_t>(1, widest)(rng);
    auto work = SelectUnion(c, scores, top_k);
    ASSERT_TRUE(work.ok()) << work.status();
    auto builder = PlanBuilder::Create(c);
    ASSERT_TRUE(builder.ok());
    auto plan = (*builder)->BuildRouted(rc.doc_ids, *work);
    ASSERT_TRUE(plan.ok()) << plan.status();

    // Expected: the dense mask restricted to the selected tiles.
    std::vector<uint8_t> expected = ReferenceTokenMask(c, rc.doc_ids);
    for (int64_t q = 0; q < c.seq_len; ++q) {
      const auto& row = work->rows[q / c.block_q];
      for (int64_t k = 0; k < c.seq_len; ++k) {
        if (!std::binary_search(row.begin(), row.end(), int32_t(k / c.block_kv))) {
          expected[q * c.seq_len + k] = 0;
        }
      }
    }
    ASSERT_EQ(ExpandForward(*plan), expected);
    ASSERT_EQ(ExpandBackward(*plan), expected);
  }
}

TEST(BlockPlanTest, IndexTypesFollowTheContract) {
  // 1024 tokens in 2-token blocks: 512 kv blocks need uint16; grid width 512 needs uint16;
  // mask bound min(nq, nkv) x width = 512 x 512 needs uint32.
  MaskContract c = Contract(1024, 2, 512);
  c.window = LocalWindow{8, 0};
  auto plan = BuildBlockPlan(c, std::vector<int32_t>(1024, 0));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->data_next.element_bytes(), 2u);
  EXPECT_EQ(plan->data_next_t.element_bytes(), 2u);
  EXPECT_EQ(plan->grid_width.element_bytes(), 2u);
  EXPECT_EQ(plan->mask_next.element_bytes(), 4u);
  EXPECT_EQ(sizeof(plan->block_mask[0]), 1u);
}

// ---- Metadata size at 256x256 tiles, 10% active, per head ----

TEST(BlockPlanSizeTest, PrintsMetadataSizesAgainstBlockCoo) {
  struct Row {
    int32_t seq_len;
    int32_t seed_kb;  // the seed's figure
  };
  std::printf(
      "Seed figure = Block-COO: 10%% of (N/256)^2 tiles x 2 coordinates x 4 bytes, decimal KB.\n"
      "Ours: a bidirectional local window sized to ~10%% active tiles, one document, one head.\n");
  for (const Row row : {Row{32768, 13}, Row{65536, 52}, Row{131072, 210}}) {
    const int32_t nb = row.seq_len / 256;
    const int32_t side_blocks = nb / 20;  // 2 x side + 1 blocks per row ~ 10%
    MaskContract c = Contract(row.seq_len, 256, 2 * side_blocks + 1, /*causal=*/false);
    c.window = LocalWindow{side_blocks * 256, side_blocks * 256};
    auto plan = BuildBlockPlan(c, std::vector<int32_t>(row.seq_len, 0));
    ASSERT_TRUE(plan.ok()) << plan.status();

    const double tiles = double(nb) * nb;
    const double seed_coo = 0.10 * tiles * 2 * 4;
    const double fraction = plan->active_tiles / tiles;
    const MetadataSizes sizes = plan->Sizes();
    const size_t coo = size_t(plan->active_tiles) * 2 * 4;
    const size_t per_head = sizes.tables() / c.heads_per_plan;
    EXPECT_NEAR(seed_coo / 1000, row.seed_kb, 0.5) << "seed formula";
    EXPECT_NEAR(fraction, 0.10, 0.01);
    std::printf(
        "N=%6d  tiles=%3dx%-3d active=%6lld (%.1f%%)  seed Block-COO=%.1f KB  our COO=%.1f KB  "
        "our tables=%.1f KB per head (block_mask %.1f KB, compact %.1f KB, data_next %zu-byte "
        "indices) + partial masks %.1f KB (%d distinct)\n",
        row.seq_len, nb, nb, static_cast<long long>(plan->active_tiles), 100 * fraction,
        seed_coo / 1000, coo / 1000.0, per_head / 1000.0, sizes.block_mask / 1000.0,
        (sizes.tables() - sizes.block_mask) / 1000.0, plan->data_next.element_bytes(),
        sizes.partial_masks / 1000.0, plan->num_partial_masks);
    std::printf("          %s\n", sizes.ToString().c_str());
  }
}

}  // namespace
}  // namespace meshrun::worker::sparse
