#include "worker/batch_sources.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace meshrun::worker {
namespace {

using runtime::DType;
using runtime::HostArray;

uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// The random stream of one row of one step: a function of (seed, step, row) only.
uint64_t RowHash(uint64_t seed, int64_t step, int64_t row) {
  return SplitMix(SplitMix(SplitMix(seed) ^ static_cast<uint64_t>(step)) ^
                  static_cast<uint64_t>(row));
}

// Also clears doc_ids_length when batch.doc_ids is not declared.
absl::Status CheckSpec(TokenBatchSpec& spec) {
  int tokens = 0, doc_ids = 0;
  for (const std::string& name : spec.inputs) {
    if (name == kTokensInput) {
      ++tokens;
    } else if (name == kDocIdsInput) {
      ++doc_ids;
    } else {
      return absl::InvalidArgumentError(absl::StrCat("batch input \"", name, "\" cannot be filled "
                                                     "from token data; only ", kTokensInput,
                                                     " and ", kDocIdsInput));
    }
  }
  if (tokens != 1 || doc_ids > 1) {
    return absl::InvalidArgumentError(absl::StrCat("the step must take ", kTokensInput,
                                                   " once (and ", kDocIdsInput, " at most once)"));
  }
  if (spec.batch < 1 || spec.length < 1) {
    return absl::InvalidArgumentError(absl::StrCat(kTokensInput, " must be [B, L] with B, L >= 1"));
  }
  if (doc_ids == 1 && (spec.doc_ids_length < 1 || spec.doc_ids_length > spec.length)) {
    return absl::InvalidArgumentError(absl::StrCat(kDocIdsInput, " length ", spec.doc_ids_length,
                                                   " must be in [1, ", spec.length, "]"));
  }
  if (doc_ids == 0) spec.doc_ids_length = 0;
  if (spec.first_row < 0) {
    return absl::InvalidArgumentError(absl::StrCat("first_row ", spec.first_row, " is negative"));
  }
  for (int64_t row : spec.rows) {
    if (row < 0 || row >= spec.batch) {
      return absl::InvalidArgumentError(absl::StrCat("row ", row, " is outside [0, ", spec.batch, ")"));
    }
  }
  return absl::OkStatus();
}

// Fills the held rows of each step's arrays; how a row is made is the subclass's.
class CycledBatches final : public BatchSource {
 public:
  explicit CycledBatches(std::vector<std::vector<runtime::HostArray>> batches)
      : batches_(std::move(batches)) {}
  absl::StatusOr<std::vector<runtime::HostArray>> Next() override {
    return batches_[next_++ % batches_.size()];
  }
  absl::Status Skip(int64_t consumed) override {
    next_ += static_cast<size_t>(consumed);
    return absl::OkStatus();
  }

 private:
  std::vector<std::vector<runtime::HostArray>> batches_;
  size_t next_ = 0;
};

class RowBatches : public BatchSource {
 public:
  explicit RowBatches(TokenBatchSpec spec) : spec_(std::move(spec)) {}

  absl::StatusOr<std::vector<HostArray>> Next() final {
    ++step_;
    HostArray tokens{{DType::kS32, {spec_.batch, spec_.length}}, {}};
    tokens.bytes.assign(static_cast<size_t>(tokens.shape.ByteSize()), '\0');
    HostArray doc_ids{{DType::kS32, {spec_.batch, spec_.doc_ids_length}}, {}};
    doc_ids.bytes.assign(static_cast<size_t>(doc_ids.shape.ByteSize()), '\0');
    for (int64_t row : spec_.rows) {
      FillRow(RowHash(spec_.seed, step_, spec_.first_row + row),
              reinterpret_cast<int32_t*>(tokens.bytes.data()) + row * spec_.length,
              reinterpret_cast<int32_t*>(doc_ids.bytes.data()) + row * spec_.doc_ids_length);
    }
    std::vector<HostArray> out;
    for (const std::string& name : spec_.inputs) {
      out.push_back(name == kTokensInput ? tokens : doc_ids);
    }
    return out;
  }
  // A row depends on (seed, step, row) only: seeking is setting the step.
  absl::Status Skip(int64_t consumed) final {
    step_ += consumed;
    return absl::OkStatus();
  }

 protected:
  // Writes L tokens and L' document ids (L' may be 0).
  virtual void FillRow(uint64_t hash, int32_t* tokens, int32_t* doc_ids) const = 0;

  const TokenBatchSpec spec_;

 private:
  int64_t step_ = 0;
};

class TokenShardBatches final : public RowBatches {
 public:
  TokenShardBatches(std::shared_ptr<const TokenCorpus> corpus, TokenBatchSpec spec, int64_t windows)
      : RowBatches(std::move(spec)), corpus_(std::move(corpus)), windows_(windows) {}

 private:
  void FillRow(uint64_t hash, int32_t* tokens, int32_t* doc_ids) const override {
    const std::vector<int64_t>& starts = corpus_->document_starts();
    int64_t doc = static_cast<int64_t>(hash % static_cast<uint64_t>(windows_));
    const int64_t begin = starts[doc];
    corpus_->CopyTokens(begin, spec_.length, tokens);
    int32_t id = 0;
    for (int64_t j = 0; j < spec_.doc_ids_length; ++j) {
      while (doc + 1 < static_cast<int64_t>(starts.size()) && starts[doc + 1] <= begin + j) {
        ++doc;
        ++id;
      }
      doc_ids[j] = id;
    }
  }

  std::shared_ptr<const TokenCorpus> corpus_;
  int64_t windows_;
};

class SyntheticBatches final : public RowBatches {
 public:
  using RowBatches::RowBatches;

 private:
  void FillRow(uint64_t hash, int32_t* tokens, int32_t*) const override {
    for (int64_t j = 0; j < spec_.length; ++j) {
      hash = SplitMix(hash);
      tokens[j] = static_cast<int32_t>(hash % kSyntheticVocab);
    }
  }
};

}  // namespace

absl::StatusOr<std::vector<int64_t>> RowsHeld(int64_t rows, const std::string& axis,
                                              const std::vector<std::string>& mesh_axes,
                                              const std::vector<int64_t>& mesh_shape,
                                              const std::vector<int64_t>& partitions) {
  int64_t mesh_size = 1;
  for (int64_t size : mesh_shape) mesh_size *= size;
  const auto a = std::find(mesh_axes.begin(), mesh_axes.end(), axis) - mesh_axes.begin();
  if (!axis.empty() && (a == static_cast<int64_t>(mesh_axes.size()) ||
                        a >= static_cast<int64_t>(mesh_shape.size()))) {
    return absl::InvalidArgumentError(absl::StrCat("unknown mesh axis \"", axis, "\""));
  }
  if (!axis.empty() && rows % mesh_shape[a] != 0) {
    return absl::InvalidArgumentError(absl::StrCat(rows, " rows do not split ", mesh_shape[a],
                                                   " ways over mesh axis \"", axis, "\""));
  }
  std::set<int64_t> held;
  for (int64_t p : partitions) {
    if (p < 0 || p >= mesh_size) {
      return absl::InvalidArgumentError(absl::StrCat("partition ", p, " is outside the mesh of ",
                                                     mesh_size));
    }
    if (axis.empty()) {
      for (int64_t r = 0; r < rows; ++r) held.insert(r);
      continue;
    }
    // Partition p's coordinate along the axis, row-major over the mesh.
    int64_t coord = p;
    for (int64_t i = static_cast<int64_t>(mesh_shape.size()) - 1; i > a; --i) coord /= mesh_shape[i];
    coord %= mesh_shape[a];
    const int64_t block = rows / mesh_shape[a];
    for (int64_t r = coord * block; r < (coord + 1) * block; ++r) held.insert(r);
  }
  return std::vector<int64_t>(held.begin(), held.end());
}

absl::StatusOr<std::unique_ptr<BatchSource>> MakeTokenShardBatches(
    std::shared_ptr<const TokenCorpus> corpus, TokenBatchSpec spec) {
  RETURN_IF_ERROR(CheckSpec(spec));
  if (corpus == nullptr) return absl::InvalidArgumentError("no token corpus");
  const int64_t windows = corpus->WindowCount(spec.length);
  if (windows == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the token shards hold ", corpus->num_tokens(), " tokens: no document starts a window of ",
        spec.length, " tokens"));
  }
  return std::make_unique<TokenShardBatches>(std::move(corpus), std::move(spec), windows);
}

std::unique_ptr<BatchSource> MakeCycledBatches(std::vector<std::vector<runtime::HostArray>> batches) {
  return std::make_unique<CycledBatches>(std::move(batches));
}

absl::StatusOr<std::unique_ptr<BatchSource>> MakeSyntheticBatches(TokenBatchSpec spec) {
  RETURN_IF_ERROR(CheckSpec(spec));
  return std::make_unique<SyntheticBatches>(std::move(spec));
}

}  // namespace meshrun::worker
