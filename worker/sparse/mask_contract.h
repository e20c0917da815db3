// The static mask contract of block-sparse attention: everything about the mask that a
// compiled step bakes into its shapes and semantics. Per-batch document ids are payload and
// are deliberately not part of it, so a new batch never changes the cache key.
//
// Lifetime: plain value type. Thread-safety: const methods are safe from any thread.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"

namespace meshrun::worker::sparse {

// Token q may attend token k only if q - left <= k <= q + right (both in tokens, >= 0).
struct LocalWindow {
  int32_t left = 0;
  int32_t right = 0;

  friend bool operator==(const LocalWindow&, const LocalWindow&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const LocalWindow& w) {
    return H::combine(std::move(h), w.left, w.right);
  }
};

struct MaskContract {
  // Tokens per sequence. Part of the contract because the table shapes (nq, nkv) and the
  // compiled step depend on it.
  int32_t seq_len = 0;
  // Token q may attend token k only if k <= q.
  bool causal = true;
  // Unset: no positional restriction besides `causal`. With causal, `right` is effectively 0.
  std::optional<LocalWindow> window;
  int32_t block_q = 256;
  int32_t block_kv = 256;
  // Fixed width of the compacted per-row (forward) and per-column (backward) tables.
  int32_t max_grid_width = 0;
  // Attention heads that share one plan; routed selection unions their choices.
  int32_t heads_per_plan = 1;

  int32_t num_q_blocks() const { return block_q > 0 ? seq_len / block_q : 0; }
  int32_t num_kv_blocks() const { return block_kv > 0 ? seq_len / block_kv : 0; }

  // Effective window bounds in tokens (k - q in [-left, right]), folding in `causal` and
  // using a value wider than any sequence for "unbounded".
  int64_t effective_left() const;
  int64_t effective_right() const;

  // Checks the fields against each other. InvalidArgument naming the field and the fix for:
  // non-positive seq_len / block sizes / max_grid_width / heads_per_plan, block sizes that do
  // not divide seq_len, max_grid_width above max(num_q_blocks, num_kv_blocks), a negative
  // window side or one wider than the sequence.
  absl::Status Validate() const;

  // The same contract with semantically irrelevant differences removed (with causal, a
  // window's right side is set to 0), so equal masks share one cache key.
  MaskContract Canonical() const;

  // E.g. "MaskContract{seq_len=64, causal=true, window=none, block_q=16, ...}".
  std::string ToString() const;

  friend bool operator==(const MaskContract&, const MaskContract&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const MaskContract& c) {
    // Debian's abseil hashes absl::optional, not std::optional, so spell the optional out.
    h = H::combine(std::move(h), c.window.has_value(), c.window.value_or(LocalWindow{}));
    return H::combine(std::move(h), c.seq_len, c.causal, c.block_q, c.block_kv,
                      c.max_grid_width, c.heads_per_plan);
  }
};

// The token-level predicate the plan encodes: same document (doc_ids non-decreasing) and
// inside the effective window. Inline so reference loops (tests, baseline) can vectorize.
inline bool TokenAllowed(int64_t effective_left, int64_t effective_right, int32_t doc_q,
                         int32_t doc_k, int64_t q, int64_t k) {
  const int64_t d = k - q;
  return doc_q == doc_k && d >= -effective_left && d <= effective_right;
}

}  // namespace meshrun::worker::sparse
