// The token-shard reader (worker/token_shards.h, format in docs/data.md) on any file: the
// input is written as the one shard a glob matches, then read back through the reader's
// windows. Seeds: small version-1 (u16) and version-2 (u32) shards holding the first
// documents of the examples' token shards (.data/fortunes, written by setup), or of a fixed
// text when those are absent. Property: no crash, a refusal is INVALID_ARGUMENT (or a read
// error code), an accepted corpus answers every window inside it.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "worker/token_shards.h"

namespace {

std::string& Dir() {
  static std::string dir;
  return dir;
}

template <typename T>
void Put(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(value));  // little-endian host
}

// A shard of `documents` (each starting with BOS 0), tokens `width` bytes wide.
std::string Shard(const std::vector<std::vector<uint32_t>>& documents, int width) {
  uint64_t tokens = 0;
  for (const auto& d : documents) tokens += d.size();
  std::string out(meshrun::worker::kTokenShardMagic, 8);
  Put<uint32_t>(&out, width == 2 ? 1 : 2);
  Put<uint32_t>(&out, width == 2 ? 256 : 70000);
  Put<uint32_t>(&out, 0);
  Put<uint32_t>(&out, width == 2 ? 0 : 4);
  Put<uint64_t>(&out, tokens);
  Put<uint64_t>(&out, documents.size());
  Put<uint64_t>(&out, 0);
  for (const auto& d : documents) {
    for (uint32_t t : d) width == 2 ? Put<uint16_t>(&out, t) : Put<uint32_t>(&out, t);
  }
  uint64_t start = 0;
  for (const auto& d : documents) {
    Put<uint64_t>(&out, start);
    start += d.size();
  }
  return out;
}

// The first few documents of the examples' first shard (u16 tokens), if it is there.
std::vector<std::vector<uint32_t>> ExampleDocuments() {
  std::ifstream in(MESHRUN_SOURCE_DIR "/.data/fortunes/shard-00000.tok", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::vector<uint32_t>> docs;
  if (bytes.size() < 48 + 2 * 600) {
    for (const char* text : {"The examples train on fortunes.", "A second, shorter one."}) {
      docs.push_back({0});
      for (const char* c = text; *c != '\0'; ++c) docs.back().push_back(uint8_t(*c));
    }
    return docs;
  }
  for (size_t i = 0; i < 600; ++i) {
    uint16_t token;
    std::memcpy(&token, bytes.data() + 48 + 2 * i, 2);
    if (token == 0 || docs.empty()) docs.emplace_back();
    docs.back().push_back(token);
    if (docs.size() > 4) break;
  }
  docs.pop_back();  // the last may be cut short: keep whole documents only
  return docs;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  using namespace meshrun;
  fuzz::QuietLogs();
  const auto docs = ExampleDocuments();
  fuzz::MaybeWriteSeeds({Shard(docs, 2), Shard(docs, 4), Shard({docs.front()}, 2)});
  Dir() = fuzz::ScratchDir("shards");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace meshrun;
  fuzz::WriteFile(Dir() + "/shard-0.tok", {reinterpret_cast<const char*>(data), size});
  const auto corpus = worker::TokenCorpus::Open(Dir() + "/*.tok");
  fuzz::ExpectDocumentedError(corpus.status(), "TokenCorpus::Open",
                              {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
                               absl::StatusCode::kPermissionDenied, absl::StatusCode::kDataLoss});
  if (!corpus.ok()) return 0;
  const worker::TokenCorpus& c = **corpus;
  const int64_t n = c.num_tokens();
  std::vector<int32_t> window(static_cast<size_t>(std::min<int64_t>(n, 64)));
  if (!window.empty()) {
    c.CopyTokens(0, static_cast<int64_t>(window.size()), window.data());
    c.CopyTokens(n - static_cast<int64_t>(window.size()), static_cast<int64_t>(window.size()),
                 window.data());
    for (int32_t t : window) {
      if (t < 0 || static_cast<uint32_t>(t) >= c.vocab_size()) __builtin_trap();
    }
  }
  for (int64_t length : {int64_t{1}, int64_t{8}, n, n + 1}) (void)c.WindowCount(length);
  return 0;
}
