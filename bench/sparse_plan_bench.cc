// Plan building for block-sparse attention vs the dense approach of FlexAttention's
// create_block_mask: evaluate the token mask predicate at every (q, k) of every tile and sum it
// per tile to classify (O(N^2)). Both run in this process on the same inputs; the planner's
// block_mask must equal the baseline's classification. Prints absolute medians and, as the
// last line, "ratio plan_vs_dense_128k <baseline / plan>" (higher is better).
//
// Usage: meshrun_sparse_plan_bench [--quick]   (--quick: fewer repeats, for smoke runs)

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "worker/sparse/block_plan.h"
#include "worker/sparse/mask_contract.h"

namespace {

using meshrun::worker::sparse::BlockPlan;
using meshrun::worker::sparse::LocalWindow;
using meshrun::worker::sparse::MaskContract;
using meshrun::worker::sparse::PlanBuilder;
using meshrun::worker::sparse::TokenAllowed;
using Clock = std::chrono::steady_clock;

// Above this estimated baseline time, time a fixed number of tile rows and extrapolate.
constexpr double kExtrapolateAboveSeconds = 60.0;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<int32_t> PackedDocIds(int32_t n, int32_t min_len, int32_t max_len, uint32_t seed,
                                  int32_t* num_docs) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> len(min_len, max_len);
  std::vector<int32_t> ids(n);
  int32_t doc = 0;
  for (int32_t pos = 0; pos < n; ++doc) {
    const int32_t end = std::min(n, pos + len(rng));
    for (; pos < end; ++pos) ids[pos] = doc;
  }
  *num_docs = doc;
  return ids;
}

// The baseline: classify tile rows [row_begin, row_end) by summing the predicate over every
// token pair of every tile. Writes 0/1/2 like block_mask.
void DenseClassifyRows(const MaskContract& c, const std::vector<int32_t>& doc_ids,
                       int32_t row_begin, int32_t row_end, std::vector<uint8_t>& block_mask) {
  const int64_t left = c.effective_left();
  const int64_t right = c.effective_right();
  const int32_t nkv = c.num_kv_blocks();
  const int64_t tile_size = int64_t{c.block_q} * c.block_kv;
  const int32_t* docs = doc_ids.data();
  for (int32_t i = row_begin; i < row_end; ++i) {
    for (int32_t j = 0; j < nkv; ++j) {
      int64_t allowed = 0;
      for (int32_t q = i * c.block_q; q < (i + 1) * c.block_q; ++q) {
        const int32_t doc_q = docs[q];
        int32_t row_sum = 0;
        for (int32_t k = j * c.block_kv; k < (j + 1) * c.block_kv; ++k) {
          row_sum += TokenAllowed(left, right, doc_q, docs[k], q, k);
        }
        allowed += row_sum;
      }
      block_mask[int64_t{i} * nkv + j] = allowed == 0 ? 0 : allowed == tile_size ? 2 : 1;
    }
  }
}

struct Result {
  double plan_seconds = 0;
  double dense_seconds = 0;  // full baseline (measured or extrapolated)
  bool extrapolated = false;
};

Result RunCase(const char* name, const MaskContract& contract, const std::vector<int32_t>& doc_ids,
               int plan_repeats, int dense_repeats) {
  Result result;
  auto builder = PlanBuilder::Create(contract);
  if (!builder.ok()) {
    std::fprintf(stderr, "%s: %s\n", name, builder.status().ToString().c_str());
    std::exit(1);
  }

  // Planner: median of repeated Build() on the cached builder (the per-batch cost).
  std::vector<double> plan_times;
  BlockPlan plan;
  for (int r = 0; r < plan_repeats; ++r) {
    const auto start = Clock::now();
    auto built = (*builder)->Build(doc_ids);
    plan_times.push_back(Seconds(Clock::now() - start));
    if (!built.ok()) {
      std::fprintf(stderr, "%s: %s\n", name, built.status().ToString().c_str());
      std::exit(1);
    }
    plan = std::move(*built);
  }
  result.plan_seconds = Median(plan_times);

  // Baseline: probe a few rows to decide between full runs and extrapolation.
  const int32_t nq = contract.num_q_blocks();
  const int32_t nkv = contract.num_kv_blocks();
  std::vector<uint8_t> dense(static_cast<size_t>(nq) * nkv, 255);
  const int32_t probe_rows = std::min(nq, 8);
  auto start = Clock::now();
  DenseClassifyRows(contract, doc_ids, 0, probe_rows, dense);
  const double estimate = Seconds(Clock::now() - start) * nq / probe_rows;
  int32_t rows_timed = nq;
  if (estimate > kExtrapolateAboveSeconds) {
    rows_timed = std::max<int32_t>(probe_rows, static_cast<int32_t>(nq * 10.0 / estimate));
    result.extrapolated = true;
  }
  std::vector<double> dense_times;
  const int repeats = result.extrapolated ? 1 : dense_repeats;
  for (int r = 0; r < repeats; ++r) {
    start = Clock::now();
    DenseClassifyRows(contract, doc_ids, 0, rows_timed, dense);
    dense_times.push_back(Seconds(Clock::now() - start) * nq / rows_timed);
  }
  result.dense_seconds = Median(dense_times);

  // The two must agree on every tile the baseline classified.
  const size_t checked = static_cast<size_t>(rows_timed) * nkv;
  if (std::memcmp(dense.data(), plan.block_mask.data(), checked) != 0) {
    std::fprintf(stderr, "%s: planner block_mask differs from the dense classification\n", name);
    std::exit(1);
  }

  int64_t partial = 0;
  for (uint8_t t : plan.block_mask) partial += t == 1;
  const double evals = static_cast<double>(contract.seq_len) * contract.seq_len;
  std::printf(
      "%s N=%d: plan median %.3f ms over %d runs (%lld active tiles, %lld partial, %d distinct "
      "partial masks, tables %zu B + masks %zu B)\n",
      name, contract.seq_len, result.plan_seconds * 1e3, plan_repeats,
      static_cast<long long>(plan.active_tiles), static_cast<long long>(partial),
      plan.num_partial_masks, plan.Sizes().tables(), plan.Sizes().partial_masks);
  if (result.extrapolated) {
    std::printf(
        "%s N=%d: dense %.3f s EXTRAPOLATED linearly from %d of %d tile rows (full run estimated "
        "at %.0f s > %.0f s); %.2fG predicate evaluations; block_mask identical on those rows\n",
        name, contract.seq_len, result.dense_seconds, rows_timed, nq, estimate,
        kExtrapolateAboveSeconds, evals / 1e9);
  } else {
    std::printf(
        "%s N=%d: dense median %.3f s over %d runs, %.2fG (%.0f Gi) predicate evaluations "
        "(%.2f G/s); block_mask identical\n",
        name, contract.seq_len, result.dense_seconds, repeats, evals / 1e9,
        evals / (1u << 30), evals / 1e9 / result.dense_seconds);
  }
  std::printf("%s N=%d: ratio %.1f\n", name, contract.seq_len,
              result.dense_seconds / result.plan_seconds);
  std::fflush(stdout);
  return result;
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  constexpr uint32_t kSeed = 42;
  constexpr int32_t kMinDoc = 256, kMaxDoc = 8192;
  std::printf(
      "meshrun_sparse_plan_bench: planner (per-block doc ranges + window arithmetic, masks only "
      "for partial tiles) vs dense per-tile predicate sums (FlexAttention create_block_mask "
      "style), single thread\n");

  double ratio_128k = 0;
  for (const int32_t n : {32768, 131072}) {
    int32_t num_docs = 0;
    const std::vector<int32_t> doc_ids = PackedDocIds(n, kMinDoc, kMaxDoc, kSeed, &num_docs);
    MaskContract c;
    c.seq_len = n;
    c.causal = true;
    c.block_q = 256;
    c.block_kv = 256;
    c.max_grid_width = 64;  // documents are at most 8192 tokens = 32 blocks (+1 straddling)
    std::printf("causal+docs N=%d: %s, %d packed documents with lengths uniform in [%d, %d] "
                "(seed %u)\n",
                n, c.ToString().c_str(), num_docs, kMinDoc, kMaxDoc, kSeed);
    const bool big = n > 65536;
    const Result r = RunCase("causal+docs", c, doc_ids, quick ? 3 : (big ? 21 : 51),
                             quick ? 1 : (big ? 3 : 5));
    if (big) ratio_128k = r.dense_seconds / r.plan_seconds;

    if (!big) {  // one windowed variant, at the cheaper length
      c.window = LocalWindow{4096, 0};
      c.max_grid_width = 32;
      std::printf("causal+docs+window N=%d: %s\n", n, c.ToString().c_str());
      RunCase("causal+docs+window", c, doc_ids, quick ? 3 : 51, quick ? 1 : 5);
    }
  }
  std::printf("ratio plan_vs_dense_128k %.1f\n", ratio_128k);
  return 0;
}
