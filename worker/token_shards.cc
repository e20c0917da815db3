#include "worker/token_shards.h"

#include <glob.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace meshrun::worker {
namespace {

// Little-endian reads from a buffer already checked to be long enough.
template <typename T>
T Read(const std::string& bytes, int64_t offset) {
  T value;
  std::memcpy(&value, bytes.data() + offset, sizeof(T));
  return value;  // x86-64 and aarch64 Linux are little-endian, like the format
}

struct Shard {
  uint32_t vocab_size = 0;
  uint32_t bos = 0;
  int64_t tokens = 0;
  int64_t documents = 0;
};

// Checks the layout of docs/data.md and appends the shard's tokens and document starts.
absl::Status ParseShard(const std::string& path, const std::string& bytes, Shard* shard,
                        std::vector<uint16_t>* tokens, std::vector<int64_t>* starts) {
  auto bad = [&](const std::string& problem) {
    return absl::InvalidArgumentError(absl::StrCat("token shard ", path, ": ", problem));
  };
  const int64_t size = static_cast<int64_t>(bytes.size());
  if (size < kTokenShardHeaderBytes) {
    return bad(absl::StrCat("truncated: ", size, " bytes, the header alone is ",
                            kTokenShardHeaderBytes));
  }
  if (std::memcmp(bytes.data(), kTokenShardMagic, sizeof(kTokenShardMagic)) != 0) {
    return bad("bad magic: not a token shard (write one with examples/make_token_shards.py)");
  }
  if (const uint32_t version = Read<uint32_t>(bytes, 8); version != kTokenShardVersion) {
    return bad(absl::StrCat("version ", version, " is not supported (this reader reads ",
                            kTokenShardVersion, ")"));
  }
  shard->vocab_size = Read<uint32_t>(bytes, 12);
  shard->bos = Read<uint32_t>(bytes, 16);
  const uint64_t num_tokens = Read<uint64_t>(bytes, 24);
  const uint64_t num_documents = Read<uint64_t>(bytes, 32);
  if (shard->vocab_size == 0 || shard->vocab_size > 65536 || shard->bos >= shard->vocab_size) {
    return bad(absl::StrCat("vocab_size ", shard->vocab_size, " / bos ", shard->bos,
                            " invalid (need bos < vocab_size <= 65536)"));
  }
  if (Read<uint32_t>(bytes, 20) != 0) return bad("reserved header field is not 0");
  // Bounded before multiplying, so a corrupt count cannot overflow.
  if (num_tokens > static_cast<uint64_t>(size) || num_documents > static_cast<uint64_t>(size)) {
    return bad(absl::StrCat("truncated: header counts ", num_tokens, " tokens and ",
                            num_documents, " documents, the file has ", size, " bytes"));
  }
  const int64_t expected = kTokenShardHeaderBytes + 2 * static_cast<int64_t>(num_tokens) +
                           8 * static_cast<int64_t>(num_documents);
  if (size != expected) {
    return bad(absl::StrCat(size < expected ? "truncated" : "trailing bytes", ": ", size,
                            " bytes, the header's counts (", num_tokens, " tokens, ",
                            num_documents, " documents) need ", expected));
  }
  if ((num_tokens == 0) != (num_documents == 0)) {
    return bad("tokens without documents (or documents without tokens)");
  }
  const int64_t base = static_cast<int64_t>(tokens->size());
  const int64_t token_offset = kTokenShardHeaderBytes;
  const int64_t starts_offset = token_offset + 2 * static_cast<int64_t>(num_tokens);
  tokens->resize(base + num_tokens);
  std::memcpy(tokens->data() + base, bytes.data() + token_offset, 2 * num_tokens);
  for (int64_t i = base; i < static_cast<int64_t>(tokens->size()); ++i) {
    if ((*tokens)[i] >= shard->vocab_size) {
      return bad(absl::StrCat("token ", i - base, " is ", (*tokens)[i], ", outside vocab_size ",
                              shard->vocab_size));
    }
  }
  for (uint64_t d = 0; d < num_documents; ++d) {
    const uint64_t start = Read<uint64_t>(bytes, starts_offset + 8 * static_cast<int64_t>(d));
    const bool in_order = d == 0 ? start == 0 : start > static_cast<uint64_t>(starts->back() - base);
    if (!in_order || start >= num_tokens) {
      return bad(absl::StrCat("document ", d, " starts at ", start,
                              ": starts must begin at 0, increase and stay below ", num_tokens));
    }
    if ((*tokens)[base + start] != shard->bos) {
      return bad(absl::StrCat("document ", d, " does not start with the BOS token ", shard->bos));
    }
    starts->push_back(base + static_cast<int64_t>(start));
  }
  shard->tokens = static_cast<int64_t>(num_tokens);
  shard->documents = static_cast<int64_t>(num_documents);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> Glob(const std::string& pattern) {
  if (pattern.empty()) return absl::InvalidArgumentError("the token shard glob is empty");
  glob_t matches{};
  const int rc = glob(pattern.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> files;
  for (size_t i = 0; rc == 0 && i < matches.gl_pathc; ++i) files.push_back(matches.gl_pathv[i]);
  globfree(&matches);
  if (rc == GLOB_NOMATCH || (rc == 0 && files.empty())) {
    return absl::InvalidArgumentError(absl::StrCat("no file matches \"", pattern,
                                                   "\" (generate shards with "
                                                   "examples/make_token_shards.py)"));
  }
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the files of \"", pattern, "\""));
  }
  std::sort(files.begin(), files.end());
  return files;
}

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) {
    return absl::InvalidArgumentError(absl::StrCat("token shard ", path, " is not a regular file"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::PermissionDeniedError(absl::StrCat("cannot open token shard ", path));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read token shard ", path));
  return std::move(bytes).str();
}

}  // namespace

absl::StatusOr<std::shared_ptr<const TokenCorpus>> TokenCorpus::Open(const std::string& glob) {
  ASSIGN_OR_RETURN(std::vector<std::string> files, Glob(glob));
  std::shared_ptr<TokenCorpus> corpus(new TokenCorpus());
  Sha256 all;
  for (size_t i = 0; i < files.size(); ++i) {
    ASSIGN_OR_RETURN(std::string bytes, ReadFile(files[i]));
    Shard shard;
    RETURN_IF_ERROR(ParseShard(files[i], bytes, &shard, &corpus->tokens_, &corpus->starts_));
    if (i == 0) {
      corpus->vocab_size_ = shard.vocab_size;
      corpus->bos_ = shard.bos;
    } else if (shard.vocab_size != corpus->vocab_size_ || shard.bos != corpus->bos_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "token shard ", files[i], ": vocab_size ", shard.vocab_size, " / bos ", shard.bos,
          " differ from ", files[0], "'s ", corpus->vocab_size_, " / ", corpus->bos_));
    }
    DataReceipt& receipt = corpus->receipt_;
    receipt.files.push_back(files[i]);
    receipt.file_sha256.push_back(Sha256Hex(bytes));
    receipt.bytes += static_cast<int64_t>(bytes.size());
    receipt.tokens += shard.tokens;
    receipt.documents += shard.documents;
    all.Update(bytes);
  }
  corpus->receipt_.sha256 = all.HexDigest();
  return std::shared_ptr<const TokenCorpus>(std::move(corpus));
}

int64_t TokenCorpus::WindowCount(int64_t length) const {
  const int64_t last_start = static_cast<int64_t>(tokens_.size()) - length;
  if (length < 1 || last_start < 0) return 0;
  return std::upper_bound(starts_.begin(), starts_.end(), last_start) - starts_.begin();
}

}  // namespace meshrun::worker
