#include "worker/sparse/planner_stages.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "worker/sparse/test_util.h"

namespace meshrun::worker::sparse {
namespace {

using Rows = std::vector<std::vector<int32_t>>;

MaskContract Contract(int32_t seq_len, int32_t block, bool causal = true) {
  MaskContract c;
  c.seq_len = seq_len;
  c.causal = causal;
  c.block_q = block;
  c.block_kv = block;
  c.max_grid_width = seq_len / block;
  return c;
}

TEST(BlockRangeTest, PositionalAndDiagonalRanges) {
  MaskContract c = Contract(128, 16);
  EXPECT_EQ(PositionalKvRange(c, 5).first, 0);
  EXPECT_EQ(PositionalKvRange(c, 5).last, 5);
  c.window = LocalWindow{32, 0};
  EXPECT_EQ(PositionalKvRange(c, 5).first, 3);  // tokens 80 - 32 = 48 -> block 3
  c.causal = false;
  c.window = LocalWindow{32, 17};
  EXPECT_EQ(PositionalKvRange(c, 5).last, 7);   // token 95 + 17 = 112 -> block 7
  EXPECT_EQ(PositionalKvRange(c, 7).last, 7);   // clipped at the sequence end
  c.block_q = 32;                               // q block 1 = tokens 32..63
  EXPECT_EQ(DiagonalKvRange(c, 1).first, 2);
  EXPECT_EQ(DiagonalKvRange(c, 1).last, 3);
  EXPECT_EQ(DiagonalKvRange(c, 1).size(), 2);
}

// ---- Union selection ----

TEST(SelectUnionTest, TopKPerRowKeepsDiagonalAndSkipsFuture) {
  const MaskContract c = Contract(64, 16);
  const float kHuge = 100;
  // [q block][kv block]; entries above the diagonal are future blocks and must be ignored.
  const std::vector<float> scores = {
      0.0f, kHuge, kHuge, kHuge,  //
      0.3f, -5.0f, kHuge, kHuge,  //
      0.1f, 0.9f,  -9.0f, kHuge,  //
      0.8f, 0.2f,  0.5f,  -1.0f,  //
  };
  auto work = SelectUnion(c, scores, /*top_k=*/2);
  ASSERT_TRUE(work.ok()) << work.status();
  EXPECT_EQ(work->rows, (Rows{{0}, {0, 1}, {1, 2}, {0, 3}}));
  EXPECT_TRUE(CheckLegality(c, *work).ok());

  auto three = SelectUnion(c, scores, 3);
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->rows, (Rows{{0}, {0, 1}, {0, 1, 2}, {0, 2, 3}}));
}

TEST(SelectUnionTest, UnionsHeadsAndBreaksTiesTowardLowerIndex) {
  MaskContract c = Contract(64, 16, /*causal=*/false);
  c.heads_per_plan = 2;
  std::vector<float> scores(2 * 4 * 4, 0.0f);  // head 0 all ties
  auto at = [&](int h, int i, int j) -> float& { return scores[(h * 4 + i) * 4 + j]; };
  at(1, 0, 3) = 1.0f;  // head 1, q block 0 prefers kv block 3
  at(1, 2, 0) = 1.0f;
  auto work = SelectUnion(c, scores, 2);
  ASSERT_TRUE(work.ok()) << work.status();
  // Head 0 (ties) takes the lowest non-diagonal index; head 1 its favourite.
  EXPECT_EQ(work->rows, (Rows{{0, 1, 3}, {0, 1}, {0, 2}, {0, 3}}));
}

TEST(SelectUnionTest, RejectsBadInput) {
  const MaskContract c = Contract(64, 16);
  const std::vector<float> scores(16, 0.0f);
  auto too_many = SelectUnion(c, scores, 5);
  ASSERT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(too_many.status().message(), "top_k=5 exceeds the 4 kv blocks available");
  EXPECT_HAS_SUBSTR(too_many.status().message(), "use top_k <= 4");

  MaskContract windowed = c;
  windowed.window = LocalWindow{16, 0};  // at most 2 blocks per row
  EXPECT_HAS_SUBSTR(SelectUnion(windowed, scores, 3).status().message(),
                    "top_k=3 exceeds the 2 kv blocks available");

  EXPECT_HAS_SUBSTR(SelectUnion(c, scores, 0).status().message(), "top_k=0 must be at least 1");
  EXPECT_HAS_SUBSTR(SelectUnion(c, std::vector<float>(15), 1).status().message(),
                    "scores has 15 entries; expected heads_per_plan x num_q_blocks x "
                    "num_kv_blocks = 1 x 4 x 4 = 16");
  std::vector<float> nan_scores(16, 0.0f);
  nan_scores[6] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_HAS_SUBSTR(SelectUnion(c, nan_scores, 1).status().message(),
                    "scores[6] is NaN (head 0, q block 1, kv block 2)");
}

// ---- Causal windowing ----

TEST(ApplyCausalWindowTest, DropsIllegalBlocksAndRestoresDiagonal) {
  MaskContract c = Contract(128, 16);
  c.window = LocalWindow{32, 0};  // row i may touch blocks i-2 .. i
  WorkSet in{Rows{{0, 5}, {}, {0, 1, 7}, {0, 1, 2, 3}, {4}, {}, {}, {0, 7}}};
  auto out = ApplyCausalWindow(c, in);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->rows, (Rows{{0}, {1}, {0, 1, 2}, {1, 2, 3}, {4}, {5}, {6}, {7}}));
  EXPECT_TRUE(CheckLegality(c, *out).ok());

  EXPECT_HAS_SUBSTR(ApplyCausalWindow(c, WorkSet{Rows(3)}).status().message(),
                    "work set has 3 rows; it needs one per q block (8)");
  WorkSet bad{Rows(8)};
  bad.rows[2] = {9};
  EXPECT_HAS_SUBSTR(ApplyCausalWindow(c, bad).status().message(),
                    "work set row 2 entry 0 = 9 is outside [0, 8)");
}

// ---- Hierarchical expansion ----

TEST(ExpandHierarchicalTest, RefinesSuperBlocksIntoLegalFineBlocks) {
  const MaskContract fine = Contract(128, 16);  // 8 x 8 fine blocks
  // Coarse: 4 super-rows (2 fine rows each) over 2 super-blocks (4 fine blocks each).
  WorkSet coarse{Rows{{0}, {0}, {1}, {0, 1}}};
  auto out = ExpandHierarchical(fine, coarse, /*q_factor=*/2, /*kv_factor=*/4);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(out->rows, (Rows{{0},
                             {0, 1},
                             {0, 1, 2},
                             {0, 1, 2, 3},
                             {4},            // super-block 1 = fine 4..7, causal keeps 4
                             {4, 5},
                             {0, 1, 2, 3, 4, 5, 6},
                             {0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_TRUE(CheckLegality(fine, *out).ok());
}

TEST(ExpandHierarchicalTest, RejectsBadFactorsAndShapes) {
  const MaskContract fine = Contract(128, 16);
  EXPECT_HAS_SUBSTR(ExpandHierarchical(fine, WorkSet{Rows(3)}, 3, 2).status().message(),
                    "q_factor=3 must be >= 1 and divide num_q_blocks=8");
  EXPECT_HAS_SUBSTR(ExpandHierarchical(fine, WorkSet{Rows(4)}, 2, 0).status().message(),
                    "kv_factor=0 must be >= 1 and divide num_kv_blocks=8");
  EXPECT_HAS_SUBSTR(ExpandHierarchical(fine, WorkSet{Rows(8)}, 2, 2).status().message(),
                    "coarse work set has 8 rows; it needs one per q block (4)");
  EXPECT_HAS_SUBSTR(ExpandHierarchical(fine, WorkSet{Rows{{0}, {4}, {0}, {0}}}, 2, 2)
                        .status()
                        .message(),
                    "coarse work set row 1 entry 0 = 4 is outside [0, 4)");
}

// ---- Legality ----

TEST(CheckLegalityTest, NamesTheOffendingRowAndEntry) {
  MaskContract c = Contract(64, 16);
  EXPECT_TRUE(CheckLegality(c, WorkSet{Rows{{0}, {0, 1}, {2}, {1, 3}}}).ok());

  absl::Status s = CheckLegality(c, WorkSet{Rows{{0}, {0, 1}, {2, 3}, {3}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(s.message(), "q-block row 2 entry 1 = kv block 3 is illegal (a future block");
  EXPECT_HAS_SUBSTR(s.message(), "legal kv blocks for this row are [0, 2]");

  EXPECT_HAS_SUBSTR(CheckLegality(c, WorkSet{Rows{{0}, {}, {2}, {3}}}).message(),
                    "q-block row 1 has no tiles");
  EXPECT_HAS_SUBSTR(CheckLegality(c, WorkSet{Rows{{0}, {0}, {2}, {3}}}).message(),
                    "q-block row 1 lacks its diagonal kv block 1, so query tokens [16, 31]");
  EXPECT_HAS_SUBSTR(CheckLegality(c, WorkSet{Rows{{0}, {1, 0}, {2}, {3}}}).message(),
                    "q-block row 1 entry 1 = 0 does not follow entry 0 = 1");
  EXPECT_HAS_SUBSTR(CheckLegality(c, WorkSet{Rows{{0}, {1}, {2}, {3, 3}}}).message(),
                    "q-block row 3 entry 1 = 3 does not follow");
  EXPECT_HAS_SUBSTR(CheckLegality(c, WorkSet{Rows{{-1, 0}, {1}, {2}, {3}}}).message(),
                    "q-block row 0 entry 0 = -1 is outside [0, 4)");
  EXPECT_HAS_SUBSTR(CheckLegality(c, WorkSet{Rows{{0}}}).message(),
                    "work set has 1 rows; it needs one per q block (4)");

  c.causal = false;
  c.window = LocalWindow{0, 16};
  EXPECT_HAS_SUBSTR(CheckLegality(c, WorkSet{Rows{{0, 1}, {0, 1}, {2, 3}, {3}}}).message(),
                    "q-block row 1 entry 0 = kv block 0 is illegal (outside the local window)");
}

// ---- Properties: no stage ever produces an illegal tile ----

MaskContract RandomContract(std::mt19937& rng) {
  static constexpr int32_t kBlocks[] = {1, 2, 4, 8, 16};
  auto pick = [&](int32_t lo, int32_t hi) {
    return std::uniform_int_distribution<int32_t>(lo, hi)(rng);
  };
  MaskContract c;
  c.block_q = kBlocks[pick(0, 4)];
  c.block_kv = kBlocks[pick(0, 4)];
  const int32_t unit = std::max(c.block_q, c.block_kv);
  c.seq_len = unit * pick(1, std::max(1, 256 / unit));
  c.causal = pick(0, 1) == 1;
  if (pick(0, 1) == 1) c.window = LocalWindow{pick(0, c.seq_len - 1), pick(0, c.seq_len - 1)};
  c.max_grid_width = c.num_kv_blocks();
  c.heads_per_plan = pick(1, 4);
  return c;
}

TEST(PlannerStagesPropertyTest, SelectUnionIsLegalAndPicksTheTopK) {
  std::mt19937 rng(1234);
  for (int iter = 0; iter < 500; ++iter) {
    const MaskContract c = RandomContract(rng);
    SCOPED_TRACE(c.ToString());
    const int32_t nq = c.num_q_blocks(), nkv = c.num_kv_blocks();
    std::vector<float> scores(size_t(c.heads_per_plan) * nq * nkv);
    std::uniform_int_distribution<int> score(-3, 3);  // coarse values, so ties are common
    for (float& s : scores) s = static_cast<float>(score(rng));
    int32_t widest = 0;
    for (int32_t i = 0; i < nq; ++i) widest = std::max(widest, PositionalKvRange(c, i).size());
    const int32_t top_k = std::uniform_int_distribution<int32_t>(1, widest)(rng);
    auto work = SelectUnion(c, scores, top_k);
    ASSERT_TRUE(work.ok()) << work.status();
    ASSERT_TRUE(CheckLegality(c, *work).ok()) << CheckLegality(c, *work);

    // Brute force: per head, the diagonal plus the best (score desc, index asc) legal blocks.
    for (int32_t i = 0; i < nq; ++i) {
      const BlockRange legal = PositionalKvRange(c, i);
      const BlockRange diagonal = DiagonalKvRange(c, i);
      std::vector<int32_t> expected;
      for (int32_t j = diagonal.first; j <= diagonal.last; ++j) expected.push_back(j);
      for (int32_t h = 0; h < c.heads_per_plan; ++h) {
        std::vector<std::pair<float, int32_t>> ranked;
        for (int32_t j = legal.first; j <= legal.last; ++j) {
          if (!diagonal.contains(j)) ranked.push_back({-scores[(size_t(h) * nq + i) * nkv + j], j});
        }
        std::sort(ranked.begin(), ranked.end());
        const int32_t slots = std::max(0, top_k - diagonal.size());
        for (int32_t s = 0; s < slots && s < int32_t(ranked.size()); ++s) {
          expected.push_back(ranked[s].second);
        }
      }
      std::sort(expected.begin(), expected.end());
      expected.erase(std::unique(expected.begin(), expected.end()), expected.end());
      ASSERT_EQ(work->rows[i], expected) << "row " << i;
    }
  }
}

TEST(PlannerStagesPropertyTest, WindowingAndExpansionAreAlwaysLegal) {
  std::mt19937 rng(99);
  for (int iter = 0; iter < 500; ++iter) {
    const MaskContract c = RandomContract(rng);
    SCOPED_TRACE(c.ToString());
    const int32_t nq = c.num_q_blocks(), nkv = c.num_kv_blocks();

    // Arbitrary in-range garbage through the windowing stage.
    WorkSet garbage;
    garbage.rows.resize(nq);
    for (auto& row : garbage.rows) {
      const int count = std::uniform_int_distribution<int>(0, 4)(rng);
      for (int e = 0; e < count; ++e) {
        row.push_back(std::uniform_int_distribution<int32_t>(0, nkv - 1)(rng));
      }
    }
    auto windowed = ApplyCausalWindow(c, garbage);
    ASSERT_TRUE(windowed.ok()) << windowed.status();
    ASSERT_TRUE(CheckLegality(c, *windowed).ok()) << CheckLegality(c, *windowed);
    for (size_t i = 0; i < garbage.rows.size(); ++i) {
      for (int32_t j : garbage.rows[i]) {  // nothing legal is lost
        if (PositionalKvRange(c, int32_t(i)).contains(j)) {
          ASSERT_TRUE(std::binary_search(windowed->rows[i].begin(), windowed->rows[i].end(), j));
        }
      }
    }

    // Random coarse choices through hierarchical expansion.
    std::vector<int32_t> q_factors, kv_factors;
    for (int32_t f = 1; f <= nq; ++f) if (nq % f == 0) q_factors.push_back(f);
    for (int32_t f = 1; f <= nkv; ++f) if (nkv % f == 0) kv_factors.push_back(f);
    const int32_t qf = q_factors[rng() % q_factors.size()];
    const int32_t kvf = kv_factors[rng() % kv_factors.size()];
    WorkSet coarse;
    coarse.rows.resize(nq / qf);
    for (auto& row : coarse.rows) {
      for (int32_t s = 0; s < nkv / kvf; ++s) {
        if (rng() % 3 == 0) row.push_back(s);
      }
    }
    auto expanded = ExpandHierarchical(c, coarse, qf, kvf);
    ASSERT_TRUE(expanded.ok()) << expanded.status();
    ASSERT_TRUE(CheckLegality(c, *expanded).ok()) << CheckLegality(c, *expanded);
    for (int32_t i = 0; i < nq; ++i) {  // every fine block comes from a chosen super-block
      for (int32_t j : expanded->rows[i]) {
        const auto& super_row = coarse.rows[i / qf];
        const bool chosen = std::binary_search(super_row.begin(), super_row.end(), j / kvf);
        ASSERT_TRUE(chosen || DiagonalKvRange(c, i).contains(j)) << "row " << i << " block " << j;
      }
    }
  }
}

}  // namespace
}  // namespace meshrun::worker::sparse
