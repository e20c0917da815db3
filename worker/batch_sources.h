// The step loop's data feed: BatchSources over a TokenCorpus (token_shards.h), over fixed batches
// cycled (an examples/ bundle), or, only when a job asks for it by name, over seeded random
// tokens.
//
// Batches. A step program declares `batch.tokens` s32 [B, L] and optionally `batch.doc_ids`
// s32 [B, L'] (L' <= L). Row r of step s is a window of L tokens of the corpus, taken as one
// stream of packed documents (the files in sorted glob order), that starts at a document's BOS
// token; the document is chosen by a hash of (seed, s, r) among those whose window fits. Its
// doc_ids are the document of each of its first L' positions, renumbered from 0 (so they start at
// 0 and never decrease). A row depends on (seed, s, r) only: the global batch is the same however
// the rows are split between hosts.
//
// Data-parallel slice. A source is told the global rows its host holds (RowsHeld, from the
// partitions the host runs); Next() returns the global arrays with those rows filled and the
// others zero. The step loop uploads only the host's shards, so the zero rows are never used.
//
// Thread-safety: a BatchSource from here is used by one thread at a time (BatchSource's
// contract); it shares its TokenCorpus, which is immutable.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/step_loop.h"
#include "worker/token_shards.h"

namespace meshrun::worker {

inline constexpr char kTokensInput[] = "batch.tokens";
inline constexpr char kDocIdsInput[] = "batch.doc_ids";
// Synthetic tokens are uniform over this byte-level vocabulary (the examples' models' vocab).
inline constexpr int kSyntheticVocab = 256;

// The rows of dimension 0 (of size `rows`) that mesh partitions `partitions` hold when that
// dimension is split over mesh axis `axis` ("" = not split: every row). Sorted, distinct.
// Errors: INVALID_ARGUMENT (unknown axis, rows not divisible by the axis size, a partition
// outside the mesh).
absl::StatusOr<std::vector<int64_t>> RowsHeld(int64_t rows, const std::string& axis,
                                              const std::vector<std::string>& mesh_axes,
                                              const std::vector<int64_t>& mesh_shape,
                                              const std::vector<int64_t>& partitions);

struct TokenBatchSpec {
  // The step's batch inputs in order: each is kTokensInput or kDocIdsInput; tokens required.
  std::vector<std::string> inputs;
  int64_t batch = 0;           // B
  int64_t length = 0;          // L of batch.tokens
  int64_t doc_ids_length = 0;  // L' of batch.doc_ids (when declared), 1 <= L' <= L
  std::vector<int64_t> rows;   // the global rows this host fills, each in [0, B)
  uint64_t seed = 0;
  // Where row 0 sits in the global batch: host replicas (docs/multihost_cpu.md) each fill a
  // B-row program batch, replica h from global row h * B. Row r is made from global row
  // first_row + r.
  int64_t first_row = 0;
};

// Batches of windows of `corpus` (see the file comment).
// Errors: INVALID_ARGUMENT (a spec field, named; the corpus has no window of L tokens).
absl::StatusOr<std::unique_ptr<BatchSource>> MakeTokenShardBatches(
    std::shared_ptr<const TokenCorpus> corpus, TokenBatchSpec spec);

// `batches` (global arrays, in the step's batch-input order) in turn, from the first again after
// the last: an examples/ bundle's data. `batches` must not be empty.
std::unique_ptr<BatchSource> MakeCycledBatches(std::vector<std::vector<runtime::HostArray>> batches);

// Seeded uniform random tokens in [0, kSyntheticVocab); doc_ids are all 0 (one document per row).
// Errors: INVALID_ARGUMENT (a spec field, named).
absl::StatusOr<std::unique_ptr<BatchSource>> MakeSyntheticBatches(TokenBatchSpec spec);

}  // namespace meshrun::worker
