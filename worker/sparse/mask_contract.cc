#include "worker/sparse/mask_contract.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace meshrun::worker::sparse {
namespace {

// Wider than any int32 sequence, so "unbounded" needs no special case in range arithmetic.
constexpr int64_t kUnbounded = int64_t{1} << 40;

absl::Status CheckPositive(const char* field, int64_t value, const char* fix) {
  if (value > 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, "=", value, " must be positive; ", fix));
}

absl::Status CheckDivides(const char* field, int32_t block, int32_t seq_len) {
  if (seq_len % block == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      field, "=", block, " does not divide seq_len=", seq_len, "; choose a ", field,
      " that divides seq_len or pad the sequence to a multiple of ", block, " (",
      (seq_len / block + 1) * block, " tokens)"));
}

absl::Status CheckWindowSide(const char* field, int32_t value, int32_t seq_len) {
  if (value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, "=", value, " is negative; use a side between 0 and ", seq_len - 1));
  }
  if (value >= seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, "=", value, " is wider than the sequence (seq_len=", seq_len, "); use at most ",
        seq_len - 1, " or leave the window unset for unrestricted attention"));
  }
  return absl::OkStatus();
}

}  // namespace

int64_t MaskContract::effective_left() const { return window ? window->left : kUnbounded; }

int64_t MaskContract::effective_right() const {
  if (causal) return 0;
  return window ? window->right : kUnbounded;
}

absl::Status MaskContract::Validate() const {
  RETURN_IF_ERROR(CheckPositive("seq_len", seq_len, "set it to the tokens per sequence"));
  RETURN_IF_ERROR(CheckPositive("block_q", block_q, "256 matches the v6e MXU"));
  RETURN_IF_ERROR(CheckPositive("block_kv", block_kv, "256 matches the v6e MXU"));
  RETURN_IF_ERROR(CheckPositive("max_grid_width", max_grid_width,
                                "set it to the most kv blocks one q block may visit"));
  RETURN_IF_ERROR(CheckPositive("heads_per_plan", heads_per_plan, "use 1 for a per-head plan"));
  RETURN_IF_ERROR(CheckDivides("block_q", block_q, seq_len));
  RETURN_IF_ERROR(CheckDivides("block_kv", block_kv, seq_len));
  // Wider tables than any row or column could fill only waste memory (and a typo'd width
  // could exhaust it).
  if (const int32_t widest = std::max(num_q_blocks(), num_kv_blocks()); max_grid_width > widest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "max_grid_width=", max_grid_width, " exceeds max(num_q_blocks, num_kv_blocks)=", widest,
        ", the most tiles a row or column can hold; use at most ", widest));
  }
  if (window) {
    RETURN_IF_ERROR(CheckWindowSide("window.left", window->left, seq_len));
    RETURN_IF_ERROR(CheckWindowSide("window.right", window->right, seq_len));
  }
  return absl::OkStatus();
}

MaskContract MaskContract::Canonical() const {
  MaskContract c = *this;
  if (c.causal && c.window) c.window->right = 0;
  return c;
}

std::string MaskContract::ToString() const {
  const std::string window_text =
      window ? absl::StrCat("(left=", window->left, ", right=", window->right, ")") : "none";
  return absl::StrCat("MaskContract{seq_len=", seq_len, ", causal=", causal ? "true" : "false",
                      ", window=", window_text, ", block_q=", block_q, ", block_kv=", block_kv,
                      ", max_grid_width=", max_grid_width, ", heads_per_plan=", heads_per_plan,
                      "}");
}

}  // namespace meshrun::worker::sparse
