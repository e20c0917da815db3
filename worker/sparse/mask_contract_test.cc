#include "worker/sparse/mask_contract.h"

#include <thread>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "worker/sparse/plan_cache.h"
#include "worker/sparse/test_util.h"

namespace meshrun::worker::sparse {
namespace {

MaskContract Causal64() {
  MaskContract c;
  c.seq_len = 64;
  c.causal = true;
  c.block_q = 16;
  c.block_kv = 16;
  c.max_grid_width = 4;
  return c;
}

TEST(MaskContractTest, HashIsConsistentWithEquality) {
  MaskContract windowed = Causal64();
  windowed.window = LocalWindow{32, 0};
  MaskContract bidirectional = Causal64();
  bidirectional.causal = false;
  MaskContract wide = Causal64();
  wide.max_grid_width = 8;
  MaskContract shared = Causal64();
  shared.heads_per_plan = 4;
  MaskContract blocks = Causal64();
  blocks.block_kv = 32;
  const std::vector<MaskContract> distinct = {Causal64(), windowed, bidirectional,
                                              wide,       shared,   blocks};
  absl::flat_hash_set<size_t> hashes;
  for (const MaskContract& c : distinct) {
    EXPECT_EQ(absl::HashOf(c), absl::HashOf(MaskContract(c))) << c.ToString();
    hashes.insert(absl::HashOf(c));
  }
  EXPECT_EQ(hashes.size(), distinct.size());
  absl::flat_hash_set<MaskContract> set(distinct.begin(), distinct.end());
  EXPECT_EQ(set.size(), distinct.size());
  EXPECT_TRUE(set.contains(Causal64()));
}

TEST(MaskContractTest, ToStringNamesEveryField) {
  MaskContract c = Causal64();
  c.window = LocalWindow{8, 0};
  EXPECT_EQ(c.ToString(),
            "MaskContract{seq_len=64, causal=true, window=(left=8, right=0), block_q=16, "
            "block_kv=16, max_grid_width=4, heads_per_plan=1}");
  EXPECT_HAS_SUBSTR(Causal64().ToString(), "window=none");
}

TEST(MaskContractTest, EffectiveWindowFoldsInCausal) {
  MaskContract c = Causal64();
  c.window = LocalWindow{8, 5};
  EXPECT_EQ(c.effective_left(), 8);
  EXPECT_EQ(c.effective_right(), 0);  // causal: right is effectively 0
  c.causal = false;
  EXPECT_EQ(c.effective_right(), 5);
  c.window.reset();
  EXPECT_GT(c.effective_left(), int64_t{1} << 31);
  EXPECT_EQ(c.Canonical(), c);
  MaskContract causal_right = Causal64();
  causal_right.window = LocalWindow{8, 5};
  MaskContract causal_zero = Causal64();
  causal_zero.window = LocalWindow{8, 0};
  EXPECT_EQ(causal_right.Canonical(), causal_zero);
}

TEST(MaskContractTest, ValidateRejectsBadFieldsWithFix) {
  MaskContract c = Causal64();
  EXPECT_TRUE(c.Validate().ok());

  c.block_q = 24;
  absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(s.message(), "block_q=24 does not divide seq_len=64");
  EXPECT_HAS_SUBSTR(s.message(), "pad the sequence");

  c = Causal64();
  c.block_kv = 48;
  EXPECT_HAS_SUBSTR(c.Validate().message(), "block_kv=48 does not divide seq_len=64");

  c = Causal64();
  c.window = LocalWindow{64, 0};
  s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_HAS_SUBSTR(s.message(), "window.left=64 is wider than the sequence (seq_len=64)");
  EXPECT_HAS_SUBSTR(s.message(), "use at most 63");

  c.window = LocalWindow{4, -1};
  EXPECT_HAS_SUBSTR(c.Validate().message(), "window.right=-1 is negative");

  c = Causal64();
  c.max_grid_width = 0;
  EXPECT_HAS_SUBSTR(c.Validate().message(), "max_grid_width=0 must be positive");
  c.max_grid_width = 5;
  EXPECT_HAS_SUBSTR(c.Validate().message(),
                    "max_grid_width=5 exceeds max(num_q_blocks, num_kv_blocks)=4");
  c = Causal64();
  c.heads_per_plan = 0;
  EXPECT_HAS_SUBSTR(c.Validate().message(), "heads_per_plan=0");
  c = Causal64();
  c.seq_len = 0;
  EXPECT_HAS_SUBSTR(c.Validate().message(), "seq_len=0");
}

TEST(PlanCacheTest, KeyedByContractNotByDocIds) {
  PlanCache cache;
  auto first = cache.GetOrCreate(Causal64());
  ASSERT_TRUE(first.ok()) << first.status();

  // Two batches with different documents reuse the one builder.
  std::vector<int32_t> one_doc(64, 0);
  std::vector<int32_t> two_docs(64, 0);
  for (int i = 40; i < 64; ++i) two_docs[i] = 1;
  for (const auto* doc_ids : {&one_doc, &two_docs}) {
    auto builder = cache.GetOrCreate(Causal64());
    ASSERT_TRUE(builder.ok());
    EXPECT_EQ(builder->get(), first->get());
    EXPECT_TRUE((*builder)->Build(*doc_ids).ok());
  }
  EXPECT_EQ(cache.size(), 1);
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.hits(), 2);

  // Any static field is a different contract.
  MaskContract windowed = Causal64();
  windowed.window = LocalWindow{16, 0};
  MaskContract wider = Causal64();
  wider.max_grid_width = 3;
  ASSERT_TRUE(cache.GetOrCreate(windowed).ok());
  ASSERT_TRUE(cache.GetOrCreate(wider).ok());
  EXPECT_EQ(cache.size(), 3);

  // Semantically equal contracts share an entry.
  MaskContract windowed_right = windowed;
  windowed_right.window->right = 7;  // ignored under causal
  auto same = cache.GetOrCreate(windowed_right);
  ASSERT_TRUE(same.ok());
  EXPECT_EQ(cache.size(), 3);
}

TEST(PlanCacheTest, InvalidContractIsNotCached) {
  PlanCache cache;
  MaskContract bad = Causal64();
  bad.block_q = 7;
  auto builder = cache.GetOrCreate(bad);
  EXPECT_EQ(builder.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache.size(), 0);
}

TEST(PlanCacheTest, ConcurrentCallersShareOneBuilder) {
  PlanCache cache;
  std::vector<const PlanBuilder*> seen(4, nullptr);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        auto builder = cache.GetOrCreate(Causal64());
        if (builder.ok()) seen[t] = builder->get();
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (const PlanBuilder* b : seen) EXPECT_EQ(b, seen[0]);
  EXPECT_EQ(cache.size(), 1);
  EXPECT_EQ(cache.misses(), 1);
  EXPECT_EQ(cache.hits(), 199);
}

}  // namespace
}  // namespace meshrun::worker::sparse
