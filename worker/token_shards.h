// Real training data: token shard files (format in docs/data.md, written by
// examples/make_token_shards.py) read and validated, and their data receipt. No RPC, no
// runtime: the coordinator uses it at submit, the worker's batch sources (batch_sources.h) to
// train.
//
// Thread-safety: TokenCorpus is immutable after Open and safe to share between threads.
// Memory: the shards are memory-mapped read-only, never loaded whole; Open validates and hashes
// them in pieces and drops each piece from the process's resident set after it (the page cache
// keeps it), and a batch touches only the pages of its windows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/path_roots.h"

namespace meshrun::worker {

inline constexpr char kTokenShardMagic[8] = {'M', 'R', 'T', 'O', 'K', 'S', 'H', 'D'};
// Version 1: u16 tokens. Version 2: the header's u32 at offset 20 gives the token width in
// bytes, 2 (u16) or 4 (u32, vocabularies above 65,536). docs/data.md.
inline constexpr uint32_t kTokenShardVersion = 2;
inline constexpr int64_t kTokenShardHeaderBytes = 48;

// What a job trained on (meshrun.v1.DataReceipt).
struct DataReceipt {
  std::vector<std::string> files;        // sorted, as the glob matched them
  std::vector<std::string> file_sha256;  // one per file
  int64_t bytes = 0;
  std::string sha256;  // over the files' bytes concatenated in `files` order (cat | sha256sum)
  int64_t tokens = 0;
  int64_t documents = 0;
  bool synthetic = false;
};

// Every shard of a glob, validated and held in memory as one token stream.
class TokenCorpus {
 public:
  // Errors: INVALID_ARGUMENT when the glob is empty or matches no file, or a file is not a valid
  // shard (bad magic, unsupported version, truncated or trailing bytes, a document start out of
  // order or not on a BOS token, a token outside the vocabulary, a vocabulary or BOS differing
  // from the first file's); NOT_FOUND / PERMISSION_DENIED / DATA_LOSS when a file cannot be
  // read. Each message names the file. With `roots`, every file the glob matches must lie under
  // them once its symlinks are resolved (security: a wildcard may cross a symlink the pattern's
  // fixed part does not show); INVALID_ARGUMENT names the match as the glob found it, never
  // where it leads.
  static absl::StatusOr<std::shared_ptr<const TokenCorpus>> Open(
      const std::string& glob, const PathRoots* roots = nullptr);

  const DataReceipt& receipt() const { return receipt_; }
  uint32_t vocab_size() const { return vocab_size_; }
  uint32_t bos() const { return bos_; }
  ~TokenCorpus();
  TokenCorpus(const TokenCorpus&) = delete;
  TokenCorpus& operator=(const TokenCorpus&) = delete;
  int64_t num_tokens() const { return num_tokens_; }
  // Tokens [begin, begin + n) of the stream (across shard files) into out[0, n).
  // Requires 0 <= begin and begin + n <= num_tokens().
  void CopyTokens(int64_t begin, int64_t n, int32_t* out) const;
  // Stream position of each document's BOS token, increasing; document i ends where i+1 starts.
  const std::vector<int64_t>& document_starts() const { return starts_; }
  // How many documents start a window of `length` tokens that fits in the stream; windows are
  // drawn from documents [0, n).
  int64_t WindowCount(int64_t length) const;

 private:
  TokenCorpus() = default;

  DataReceipt receipt_;
  uint32_t vocab_size_ = 0;
  uint32_t bos_ = 0;
  struct MappedShard {
    void* base = nullptr;  // the whole file, PROT_READ; munmap'ed by ~TokenCorpus
    size_t size = 0;
    const char* tokens = nullptr;
    int width = 2;      // bytes per token
    int64_t first = 0;  // stream index of its first token
    int64_t count = 0;
  };
  std::vector<MappedShard> shards_;
  int64_t num_tokens_ = 0;
  std::vector<int64_t> starts_;
};

}  // namespace meshrun::worker
