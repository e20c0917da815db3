#include "worker/token_shards.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/sha256.h"
#include "worker/batch_sources.h"

namespace meshrun::worker {
namespace {

namespace fs = std::filesystem;
using runtime::HostArray;

// A real text shipped by Debian's fortunes package (scripts/setup.sh installs it).
constexpr char kFortunes[] = "/usr/share/games/fortunes/goedel";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void WriteAll(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

template <typename T>
void Put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// A shard laid out by hand from docs/data.md: documents are byte strings, BOS 0 prepended.
std::string HandShard(const std::vector<std::string>& docs, uint32_t version = 1) {
  std::string tokens, starts;
  int64_t n = 0;
  for (const std::string& doc : docs) {
    Put<uint64_t>(starts, n);
    Put<uint16_t>(tokens, 0);
    for (unsigned char c : doc) Put<uint16_t>(tokens, c);
    n += 1 + static_cast<int64_t>(doc.size());
  }
  std::string out(kTokenShardMagic, sizeof(kTokenShardMagic));
  Put<uint32_t>(out, version);
  Put<uint32_t>(out, 256);
  Put<uint32_t>(out, 0);
  Put<uint32_t>(out, 0);
  Put<uint64_t>(out, n);
  Put<uint64_t>(out, docs.size());
  Put<uint64_t>(out, 0);
  return out + tokens + starts;
}

class TokenShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           absl::StrCat("token_shards_test_", getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Runs examples/make_token_shards.py on `source` into dir_/shards; small shards so there are
  // several files.
  void RunScript(const std::string& source) {
    const std::string command =
        absl::StrCat(MESHRUN_PYTHON, " ", MESHRUN_SOURCE_DIR, "/examples/make_token_shards.py",
                     " --source=", source, " --out=", (dir_ / "shards").string(),
                     " --shard_tokens=2000 > /dev/null");
    ASSERT_EQ(std::system(command.c_str()), 0) << command;
  }
  std::string glob() const { return (dir_ / "shards" / "shard-*.tok").string(); }

  fs::path dir_;
};

TEST_F(TokenShardsTest, ReadsWhatTheScriptWroteFromRealText) {
  if (!fs::exists(kFortunes)) GTEST_SKIP() << kFortunes << " is absent; run scripts/setup.sh";
  if (!fs::exists(MESHRUN_PYTHON)) GTEST_SKIP() << MESHRUN_PYTHON << " is absent";
  RunScript(kFortunes);
  absl::StatusOr<std::shared_ptr<const TokenCorpus>> corpus = TokenCorpus::Open(glob());
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  const DataReceipt& receipt = (*corpus)->receipt();

  // The fortunes, split here independently of the script: lines holding only "%" separate them.
  std::vector<std::string> docs;
  std::string doc;
  for (absl::string_view line : absl::StrSplit(ReadAll(kFortunes), '\n')) {
    if (line == "%") {
      if (!doc.empty()) docs.push_back(doc);
      doc.clear();
    } else {
      absl::StrAppend(&doc, line, "\n");
    }
  }
  if (doc.find_first_not_of("\n") != std::string::npos) docs.push_back(doc);
  ASSERT_GT(docs.size(), 5u);
  EXPECT_EQ(receipt.documents, static_cast<int64_t>(docs.size()));
  ASSERT_EQ((*corpus)->document_starts().size(), docs.size());
  std::vector<int32_t> stream((*corpus)->num_tokens());
  (*corpus)->CopyTokens(0, (*corpus)->num_tokens(), stream.data());  // across every file
  int64_t position = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    ASSERT_EQ((*corpus)->document_starts()[d], position) << "document " << d;
    EXPECT_EQ(stream[position], 0);
    for (size_t i = 0; i < docs[d].size(); ++i) {
      ASSERT_EQ(stream[position + 1 + i], static_cast<unsigned char>(docs[d][i]))
          << "document " << d << " byte " << i;
    }
    position += 1 + static_cast<int64_t>(docs[d].size());
  }
  EXPECT_EQ(receipt.tokens, position);
  EXPECT_EQ((*corpus)->num_tokens(), position);

  ASSERT_GT(receipt.files.size(), 1u);
  std::string all;
  int64_t bytes = 0;
  for (size_t i = 0; i < receipt.files.size(); ++i) {
    const std::string file = ReadAll(receipt.files[i]);
    EXPECT_EQ(receipt.file_sha256[i], Sha256Hex(file));
    bytes += static_cast<int64_t>(file.size());
    all += file;
  }
  EXPECT_EQ(receipt.bytes, bytes);
  EXPECT_EQ(receipt.sha256, Sha256Hex(all));
  EXPECT_FALSE(receipt.synthetic);

  // The script is deterministic: a second run leaves the same bytes.
  RunScript(kFortunes);
  absl::StatusOr<std::shared_ptr<const TokenCorpus>> again = TokenCorpus::Open(glob());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->receipt().sha256, receipt.sha256);
}

TEST_F(TokenShardsTest, RefusesBadFilesNamingThem) {
  const std::string good = HandShard({"first document", "second"});
  const std::string path = (dir_ / "a.tok").string();
  WriteAll(path, good);
  ASSERT_TRUE(TokenCorpus::Open(path).ok());

  std::string no_bos = good;
  no_bos[kTokenShardHeaderBytes + 2 * 15] = 'x';  // the second document's BOS
  std::string big_token = good;
  big_token[kTokenShardHeaderBytes + 3] = 1;  // token 1 becomes >= 256
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  const std::vector<std::pair<std::string, std::string>> cases = {
      {bad_magic, "bad magic"},
      {HandShard({"x"}, 3), "version 3 is not supported"},
      {good.substr(0, good.size() - 3), "truncated"},
      {good.substr(0, 20), "truncated"},
      {good + "zz", "trailing bytes"},
      {no_bos, "document 1 does not start with the BOS token"},
      {big_token, "outside vocab_size 256"},
  };
  for (const auto& [bytes, expected] : cases) {
    WriteAll(path, bytes);
    const absl::Status status = TokenCorpus::Open(path).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << expected;
    EXPECT_NE(status.message().find(path), absl::string_view::npos) << status;
    EXPECT_NE(status.message().find(expected), absl::string_view::npos) << status;
  }
  const absl::Status none = TokenCorpus::Open((dir_ / "missing-*.tok").string()).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("no file matches"), absl::string_view::npos) << none;
}

// security (issue 27, item 8): the glob's fixed part lies in the data root, but its wildcard
// crosses a symlink to a directory outside it. Every match is resolved: refused, naming the
// match as found, never the file it leads to.
TEST_F(TokenShardsTest, AMatchThroughASymlinkOutOfTheRootIsRefused) {
  const fs::path root = dir_ / "root", outside = dir_ / "secrets";
  fs::create_directories(root / "corpus");
  fs::create_directories(outside);
  WriteAll((root / "corpus" / "a.tok").string(), HandShard({"inside"}));
  WriteAll((outside / "private.tok").string(), HandShard({"outside"}));
  fs::create_directory_symlink(outside, root / "link");
  absl::StatusOr<PathRoots> roots = PathRoots::Create({root.string()});
  ASSERT_TRUE(roots.ok()) << roots.status();

  EXPECT_TRUE(TokenCorpus::Open((root / "corpus" / "*.tok").string(), &*roots).ok());
  const std::string crossing = (root / "*" / "*.tok").string();
  ASSERT_TRUE(TokenCorpus::Open(crossing).ok()) << "without roots both files open";
  const absl::Status refused = TokenCorpus::Open(crossing, &*roots).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find((root / "link" / "private.tok").string()),
            absl::string_view::npos) << refused;
  EXPECT_NE(refused.message().find("outside the directories this server reads"),
            absl::string_view::npos) << refused;
  EXPECT_EQ(refused.message().find("secrets"), absl::string_view::npos)
      << "names where the link leads: " << refused;
}

TEST(RowsHeldTest, FollowsTheDataAxis) {
  const std::vector<int64_t> host0 = {0, 1, 2, 3}, host1 = {4, 5, 6, 7};
  EXPECT_EQ(*RowsHeld(8, "data", {"data"}, {8}, host1), std::vector<int64_t>({4, 5, 6, 7}));
  // ("data","model") [4,2]: partitions 0 and 1 are data replica 0.
  EXPECT_EQ(*RowsHeld(8, "data", {"data", "model"}, {4, 2}, {0, 1}),
            std::vector<int64_t>({0, 1}));
  EXPECT_EQ(RowsHeld(8, "", {"data"}, {8}, host0)->size(), 8u);
  EXPECT_FALSE(RowsHeld(8, "expert", {"data"}, {8}, host0).ok());
  EXPECT_FALSE(RowsHeld(6, "data", {"data"}, {4}, {0}).ok());
  EXPECT_FALSE(RowsHeld(8, "data", {"data"}, {8}, {8}).ok());
}

const int32_t* Row(const HostArray& array, int64_t row) {
  return reinterpret_cast<const int32_t*>(array.bytes.data()) + row * array.shape.dims[1];
}

TEST_F(TokenShardsTest, HostSplitsSeeTheSameGlobalBatch) {
  std::vector<std::string> docs;
  for (int i = 0; i < 60; ++i) docs.push_back(std::string(3 + (i * 7) % 23, 'a' + i % 26));
  WriteAll((dir_ / "b.tok").string(), HandShard(docs));
  absl::StatusOr<std::shared_ptr<const TokenCorpus>> corpus =
      TokenCorpus::Open((dir_ / "*.tok").string());
  ASSERT_TRUE(corpus.ok()) << corpus.status();

  auto source = [&](std::vector<int64_t> partitions) {
    TokenBatchSpec spec{.inputs = {kDocIdsInput, kTokensInput},
                        .batch = 8, .length = 40, .doc_ids_length = 32, .seed = 7};
    spec.rows = *RowsHeld(8, "data", {"data"}, {8}, partitions);
    return *MakeTokenShardBatches(*corpus, spec);
  };
  auto one = source({0, 1, 2, 3, 4, 5, 6, 7});
  auto first = source({0, 1, 2, 3});
  auto second = source({4, 5, 6, 7});
  std::set<std::vector<int32_t>> distinct;
  for (int step = 1; step <= 3; ++step) {
    const std::vector<HostArray> all = *one->Next();
    const std::vector<HostArray> a = *first->Next();
    const std::vector<HostArray> b = *second->Next();
    ASSERT_EQ(all.size(), 2u);
    ASSERT_EQ(all[1].shape.dims, std::vector<int64_t>({8, 40}));
    ASSERT_EQ(all[0].shape.dims, std::vector<int64_t>({8, 32}));
    for (int64_t r = 0; r < 8; ++r) {
      const std::vector<HostArray>& split = r < 4 ? a : b;
      for (int i = 0; i < 2; ++i) {
        const int64_t n = all[i].shape.dims[1];
        EXPECT_EQ(std::memcmp(Row(all[i], r), Row(split[i], r), n * 4), 0) << step << " " << r;
      }
      const std::vector<HostArray>& other = r < 4 ? b : a;  // rows a host does not hold stay 0
      EXPECT_EQ(Row(other[1], r)[0], 0);
      EXPECT_EQ(Row(other[1], r)[1], 0);
      // A row starts at a document, and its doc_ids count the BOS tokens seen so far.
      const int32_t* tokens = Row(all[1], r);
      const int32_t* ids = Row(all[0], r);
      EXPECT_EQ(tokens[0], 0);
      EXPECT_EQ(ids[0], 0);
      for (int j = 1; j < 32; ++j) EXPECT_EQ(ids[j], ids[j - 1] + (tokens[j] == 0 ? 1 : 0));
      distinct.insert(std::vector<int32_t>(tokens, tokens + 40));
    }
  }
  EXPECT_GT(distinct.size(), 12u);  // rows are drawn over the corpus, not repeated

  // Host replicas: each fills its own 4-row batch from its place in the 8-row global batch.
  auto replica = [&](int64_t index) {
    TokenBatchSpec spec{.inputs = {kDocIdsInput, kTokensInput}, .batch = 4, .length = 40,
                        .doc_ids_length = 32, .rows = {0, 1, 2, 3}, .seed = 7,
                        .first_row = 4 * index};
    return *MakeTokenShardBatches(*corpus, spec);
  };
  one = source({0, 1, 2, 3, 4, 5, 6, 7});
  auto replica0 = replica(0);
  auto replica1 = replica(1);
  for (int step = 1; step <= 3; ++step) {
    const std::vector<HostArray> all = *one->Next();
    const std::vector<HostArray> halves[2] = {*replica0->Next(), *replica1->Next()};
    ASSERT_EQ(halves[1][1].shape.dims, std::vector<int64_t>({4, 40}));
    for (int64_t r = 0; r < 8; ++r) {
      for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(std::memcmp(Row(all[i], r), Row(halves[r / 4][i], r % 4),
                              all[i].shape.dims[1] * 4),
                  0)
            << step << " " << r;
      }
    }
  }
}

TEST(SyntheticBatchesTest, SeededAndOnlyFromTokens) {
  TokenBatchSpec spec{.inputs = {kTokensInput}, .batch = 4, .length = 16, .rows = {0, 1, 2, 3},
                      .seed = 1};
  auto a = *MakeSyntheticBatches(spec);
  auto b = *MakeSyntheticBatches(spec);
  spec.seed = 2;
  auto c = *MakeSyntheticBatches(spec);
  const HostArray x = (*a->Next())[0], y = (*b->Next())[0], z = (*c->Next())[0];
  EXPECT_EQ(x.bytes, y.bytes);
  EXPECT_NE(x.bytes, z.bytes);
  for (int64_t i = 0; i < 64; ++i) {
    const int32_t t = reinterpret_cast<const int32_t*>(x.bytes.data())[i];
    EXPECT_TRUE(t >= 0 && t < kSyntheticVocab) << t;
  }
  spec.inputs = {kTokensInput, "batch.labels"};
  const absl::Status refused = MakeSyntheticBatches(spec).status();
  EXPECT_NE(refused.message().find("batch.labels"), absl::string_view::npos) << refused;
}


// --- sdk (issue 17): u32 shards (version 2) and memory-mapped reading.

// A version 2 shard with 4-byte tokens: document d is BOS + `length` tokens counting from
// `first_token + d`.
std::string U32Shard(int64_t documents, int64_t length, uint32_t vocab, uint32_t first_token) {
  std::string out(kTokenShardMagic, sizeof(kTokenShardMagic));
  Put<uint32_t>(out, 2);
  Put<uint32_t>(out, vocab);
  Put<uint32_t>(out, 0);
  Put<uint32_t>(out, 4);  // token width
  Put<uint64_t>(out, documents * (1 + length));
  Put<uint64_t>(out, documents);
  Put<uint64_t>(out, 0);
  out.reserve(out.size() + documents * (1 + length) * 4 + documents * 8);
  for (int64_t d = 0; d < documents; ++d) {
    Put<uint32_t>(out, 0);
    for (int64_t j = 0; j < length; ++j) {
      Put<uint32_t>(out, 1 + (first_token + static_cast<uint32_t>(d + j)) % (vocab - 1));
    }
  }
  for (int64_t d = 0; d < documents; ++d) Put<uint64_t>(out, d * (1 + length));
  return out;
}

TEST_F(TokenShardsTest, U32ShardsWithVocab100kFillTheLmBatch) {
  // Two files, tokens up to 99,999: above u16's range.
  WriteAll((dir_ / "a.tok").string(), U32Shard(40, 30, 100000, 99000));
  WriteAll((dir_ / "b.tok").string(), U32Shard(40, 30, 100000, 65000));
  absl::StatusOr<std::shared_ptr<const TokenCorpus>> corpus =
      TokenCorpus::Open((dir_ / "*.tok").string());
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_EQ((*corpus)->vocab_size(), 100000u);
  EXPECT_EQ((*corpus)->num_tokens(), 2 * 40 * 31);
  std::vector<int32_t> stream((*corpus)->num_tokens());
  (*corpus)->CopyTokens(0, (*corpus)->num_tokens(), stream.data());
  EXPECT_EQ(stream[1], 1 + 99000 % 99999);
  EXPECT_EQ(stream[40 * 31 + 1], 1 + 65000 % 99999);  // the second file's first token

  TokenBatchSpec spec{.inputs = {kTokensInput}, .batch = 4, .length = 50, .rows = {0, 1, 2, 3},
                      .seed = 3};
  auto source = MakeTokenShardBatches(*corpus, spec);
  ASSERT_TRUE(source.ok()) << source.status();
  int32_t largest = 0;
  for (int step = 0; step < 5; ++step) {
    const std::vector<HostArray> batch = *(*source)->Next();
    for (int64_t r = 0; r < 4; ++r) {
      const int32_t* row = Row(batch[0], r);
      // The row is a window of the stream starting at a document (BOS).
      const auto at = std::find(stream.begin(), stream.end(), row[1]) - stream.begin() - 1;
      ASSERT_GE(at, 0);
      for (int j = 0; j < 50; ++j) {
        largest = std::max(largest, row[j]);
        ASSERT_LT(row[j], 100000);
      }
    }
  }
  EXPECT_GT(largest, 65535);

  // A u16 (version 1) file cannot declare vocabulary 100,000; a bad width is named.
  std::string wide = HandShard({"x"});
  std::memcpy(wide.data() + 12, "\xa0\x86\x01\x00", 4);  // vocab 100000
  WriteAll((dir_ / "a.tok").string(), wide);
  EXPECT_NE(TokenCorpus::Open((dir_ / "a.tok").string()).status().message().find(
                "vocab_size <= 65536 for u16"),
            absl::string_view::npos);
  std::string width3 = U32Shard(1, 3, 100, 0);
  width3[20] = 3;
  WriteAll((dir_ / "a.tok").string(), width3);
  EXPECT_NE(TokenCorpus::Open((dir_ / "a.tok").string()).status().message().find(
                "token width 3 is not 2 (u16) or 4 (u32)"),
            absl::string_view::npos);
}

int64_t ResidentKiB() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6));
  }
  return -1;
}

TEST_F(TokenShardsTest, ResidentMemoryStaysFlatOnACorpusMuchLargerThanABatch) {
  // 96 MiB of u32 tokens in 3 files; a batch is 8 x 256 tokens (8 KiB).
  for (int f = 0; f < 3; ++f) {
    WriteAll((dir_ / absl::StrCat("c", f, ".tok")).string(),
             U32Shard(8192, 1023, 100000, static_cast<uint32_t>(f) * 7));
  }
  const int64_t before = ResidentKiB();
  absl::StatusOr<std::shared_ptr<const TokenCorpus>> corpus =
      TokenCorpus::Open((dir_ / "*.tok").string());
  ASSERT_TRUE(corpus.ok()) << corpus.status();
  EXPECT_GT((*corpus)->receipt().bytes, int64_t{96} << 20);
  const int64_t opened = ResidentKiB();
  TokenBatchSpec spec{.inputs = {kTokensInput}, .batch = 8, .length = 256,
                      .rows = {0, 1, 2, 3, 4, 5, 6, 7}, .seed = 1};
  auto source = MakeTokenShardBatches(*corpus, spec);
  ASSERT_TRUE(source.ok()) << source.status();
  for (int step = 0; step < 200; ++step) ASSERT_TRUE((*source)->Next().ok());
  const int64_t after = ResidentKiB();
  // Loading whole would add >= 96 MiB; mapped, with every piece validated and every window read
  // dropped from the resident set again, it adds a few MiB.
  EXPECT_LT(after - before, 24 * 1024) << "VmRSS " << before << " -> " << opened << " (opened) -> " << after << " KiB";
}

}  // namespace
}  // namespace meshrun::worker
