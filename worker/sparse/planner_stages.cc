#include "worker/sparse/planner_stages.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace meshrun::worker::sparse {
namespace {

absl::Status CheckRowCount(const WorkSet& work, int32_t expected, const char* what) {
  if (static_cast<int64_t>(work.rows.size()) == expected) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " has ", work.rows.size(),
                                                 " rows; it needs one per q block (", expected,
                                                 ")"));
}

absl::Status CheckEntriesInRange(const WorkSet& work, int32_t num_blocks, const char* what) {
  for (size_t i = 0; i < work.rows.size(); ++i) {
    for (size_t p = 0; p < work.rows[i].size(); ++p) {
      const int32_t b = work.rows[i][p];
      if (b < 0 || b >= num_blocks) {
        return absl::InvalidArgumentError(absl::StrCat(what, " row ", i, " entry ", p, " = ", b,
                                                       " is outside [0, ", num_blocks, ")"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFactor(const char* field, int32_t factor, const char* count_name,
                         int32_t count) {
  if (factor >= 1 && count % factor == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, "=", factor, " must be >= 1 and divide ",
                                                 count_name, "=", count, "; use a divisor of ",
                                                 count));
}

void SortUnique(std::vector<int32_t>& v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}

}  // namespace

BlockRange PositionalKvRange(const MaskContract& c, int32_t q_block) {
  const int64_t q0 = int64_t{q_block} * c.block_q;
  const int64_t q1 = q0 + c.block_q - 1;
  const int64_t lo = std::max<int64_t>(0, q0 - c.effective_left());
  const int64_t hi = std::min<int64_t>(c.seq_len - 1, q1 + c.effective_right());
  return {static_cast<int32_t>(lo / c.block_kv), static_cast<int32_t>(hi / c.block_kv)};
}

BlockRange DiagonalKvRange(const MaskContract& c, int32_t q_block) {
  const int64_t q0 = int64_t{q_block} * c.block_q;
  return {static_cast<int32_t>(q0 / c.block_kv),
          static_cast<int32_t>((q0 + c.block_q - 1) / c.block_kv)};
}

absl::StatusOr<WorkSet> SelectUnion(const MaskContract& contract, absl::Span<const float> scores,
                                    int32_t top_k) {
  RETURN_IF_ERROR(contract.Validate());
  const int32_t nq = contract.num_q_blocks();
  const int32_t nkv = contract.num_kv_blocks();
  const int64_t expected = int64_t{contract.heads_per_plan} * nq * nkv;
  if (static_cast<int64_t>(scores.size()) != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "scores has ", scores.size(), " entries; expected heads_per_plan x num_q_blocks x "
        "num_kv_blocks = ", contract.heads_per_plan, " x ", nq, " x ", nkv, " = ", expected));
  }
  int32_t widest = 0;
  for (int32_t i = 0; i < nq; ++i) widest = std::max(widest, PositionalKvRange(contract, i).size());
  if (top_k < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_k=", top_k, " must be at least 1: the diagonal kv block always takes one slot"));
  }
  if (top_k > widest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "top_k=", top_k, " exceeds the ", widest,
        " kv blocks available to the widest q-block row under ", contract.ToString(),
        "; use top_k <= ", widest));
  }
  for (size_t e = 0; e < scores.size(); ++e) {
    if (std::isnan(scores[e])) {
      return absl::InvalidArgumentError(absl::StrCat(
          "scores[", e, "] is NaN (head ", e / (int64_t{nq} * nkv), ", q block ", (e / nkv) % nq,
          ", kv block ", e % nkv, "); routing scores must be numbers"));
    }
  }

  WorkSet out;
  out.rows.resize(nq);
  std::vector<int32_t> candidates;
  for (int32_t i = 0; i < nq; ++i) {
    const BlockRange legal = PositionalKvRange(contract, i);
    const BlockRange diagonal = DiagonalKvRange(contract, i);
    std::vector<int32_t>& row = out.rows[i];
    for (int32_t j = diagonal.first; j <= diagonal.last; ++j) row.push_back(j);
    const int32_t slots = top_k - diagonal.size();
    if (slots <= 0) continue;
    for (int32_t h = 0; h < contract.heads_per_plan; ++h) {
      const float* head_row = scores.data() + (int64_t{h} * nq + i) * nkv;
      candidates.clear();
      for (int32_t j = legal.first; j <= legal.last; ++j) {
        if (!diagonal.contains(j)) candidates.push_back(j);
      }
      const size_t take = std::min<size_t>(slots, candidates.size());
      std::partial_sort(candidates.begin(), candidates.begin() + take, candidates.end(),
                        [head_row](int32_t a, int32_t b) {
                          return head_row[a] != head_row[b] ? head_row[a] > head_row[b] : a < b;
                        });
      row.insert(row.end(), candidates.begin(), candidates.begin() + take);
    }
    SortUnique(row);
  }
  return out;
}

absl::StatusOr<WorkSet> ApplyCausalWindow(const MaskContract& contract, const WorkSet& work) {
  RETURN_IF_ERROR(contract.Validate());
  RETURN_IF_ERROR(CheckRowCount(work, contract.num_q_blocks(), "work set"));
  RETURN_IF_ERROR(CheckEntriesInRange(work, contract.num_kv_blocks(), "work set"));
  WorkSet out;
  out.rows.resize(work.rows.size());
  for (size_t i = 0; i < work.rows.size(); ++i) {
    const BlockRange legal = PositionalKvRange(contract, static_cast<int32_t>(i));
    const BlockRange diagonal = DiagonalKvRange(contract, static_cast<int32_t>(i));
    std::vector<int32_t>& row = out.rows[i];
    for (int32_t j : work.rows[i]) {
      if (legal.contains(j)) row.push_back(j);
    }
    for (int32_t j = diagonal.first; j <= diagonal.last; ++j) row.push_back(j);
    SortUnique(row);
  }
  return out;
}

absl::StatusOr<WorkSet> ExpandHierarchical(const MaskContract& contract, const WorkSet& coarse,
                                           int32_t q_factor, int32_t kv_factor) {
  RETURN_IF_ERROR(contract.Validate());
  const int32_t nq = contract.num_q_blocks();
  const int32_t nkv = contract.num_kv_blocks();
  RETURN_IF_ERROR(CheckFactor("q_factor", q_factor, "num_q_blocks", nq));
  RETURN_IF_ERROR(CheckFactor("kv_factor", kv_factor, "num_kv_blocks", nkv));
  RETURN_IF_ERROR(CheckRowCount(coarse, nq / q_factor, "coarse work set"));
  RETURN_IF_ERROR(CheckEntriesInRange(coarse, nkv / kv_factor, "coarse work set"));
  WorkSet fine;
  fine.rows.resize(nq);
  for (int32_t i = 0; i < nq; ++i) {
    for (int32_t super_block : coarse.rows[i / q_factor]) {
      for (int32_t f = 0; f < kv_factor; ++f) fine.rows[i].push_back(super_block * kv_factor + f);
    }
  }
  return ApplyCausalWindow(contract, fine);
}

absl::Status CheckLegality(const MaskContract& contract, const WorkSet& work) {
  RETURN_IF_ERROR(contract.Validate());
  RETURN_IF_ERROR(CheckRowCount(work, contract.num_q_blocks(), "work set"));
  const int32_t nkv = contract.num_kv_blocks();
  for (size_t i = 0; i < work.rows.size(); ++i) {
    const std::vector<int32_t>& row = work.rows[i];
    const BlockRange legal = PositionalKvRange(contract, static_cast<int32_t>(i));
    const BlockRange diagonal = DiagonalKvRange(contract, static_cast<int32_t>(i));
    if (row.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "q-block row ", i, " has no tiles; every row needs at least its diagonal kv block(s) [",
          diagonal.first, ", ", diagonal.last, "]"));
    }
    for (size_t p = 0; p < row.size(); ++p) {
      const int32_t j = row[p];
      if (j < 0 || j >= nkv) {
        return absl::InvalidArgumentError(absl::StrCat("q-block row ", i, " entry ", p, " = ", j,
                                                       " is outside [0, ", nkv, ")"));
      }
      if (p > 0 && j <= row[p - 1]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "q-block row ", i, " entry ", p, " = ", j, " does not follow entry ", p - 1, " = ",
            row[p - 1], "; rows must be ascending without duplicates"));
      }
      if (!legal.contains(j)) {
        const char* why = j > legal.last && contract.causal ? "a future block under causal masking"
                                                            : "outside the local window";
        return absl::InvalidArgumentError(absl::StrCat(
            "q-block row ", i, " entry ", p, " = kv block ", j, " is illegal (", why,
            "); legal kv blocks for this row are [", legal.first, ", ", legal.last, "]"));
      }
    }
    for (int32_t j = diagonal.first; j <= diagonal.last; ++j) {
      if (!std::binary_search(row.begin(), row.end(), j)) {
        const int64_t k0 = int64_t{j} * contract.block_kv;
        const int64_t q0 = std::max<int64_t>(k0, int64_t(i) * contract.block_q);
        const int64_t q1 =
            std::min<int64_t>(k0 + contract.block_kv, int64_t(i + 1) * contract.block_q) - 1;
        return absl::InvalidArgumentError(absl::StrCat(
            "q-block row ", i, " lacks its diagonal kv block ", j, ", so query tokens [", q0, ", ",
            q1, "] could not attend themselves; add kv block ", j, " to the row"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace meshrun::worker::sparse
