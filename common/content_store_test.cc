#include "common/content_store.h"

#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/durable_file.h"
#include "common/sha256.h"

namespace meshrun {
namespace {

namespace fs = std::filesystem;

std::string Dir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/content_store_test/" + name;
  fs::remove_all(dir);
  return dir;
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ContentStoreTest, PutReadListRemove) {
  const std::string dir = Dir("basic");
  FakeClock clock;
  auto store =
      ContentStore::Create({.directory = dir, .suffix = ".blob", .clock = &clock}).value();
  const std::string sha = store->Put("hello").value();
  EXPECT_EQ(sha, Sha256Hex("hello"));
  EXPECT_EQ(store->Put("hello").value(), sha) << "the same bytes are one entry";
  EXPECT_TRUE(store->Has(sha));
  EXPECT_EQ(store->Read(sha).value(), "hello");
  EXPECT_EQ(store->bytes(), 5);
  EXPECT_EQ(Names(dir), std::vector<std::string>{sha + ".blob"}) << "no temp file is left";
  // The file's mtime is the clock's time of the last use.
  clock.Advance(absl::Hours(1));
  ASSERT_TRUE(store->Read(sha).ok());
  struct stat st;
  ASSERT_EQ(::stat(store->PathOf(sha).c_str(), &st), 0);
  EXPECT_EQ(absl::TimeFromTimespec(st.st_mtim), clock.Now());

  const std::string other = store->Put("world").value();
  EXPECT_EQ(store->List(), (std::vector<std::string>{std::min(sha, other), std::max(sha, other)}));
  EXPECT_TRUE(store->Remove(sha));
  EXPECT_FALSE(store->Remove(sha));
  EXPECT_FALSE(store->Has(sha));
  EXPECT_EQ(store->Read(sha).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(store->Read("../etc/passwd").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->bytes(), 5);
  EXPECT_EQ(Names(dir), std::vector<std::string>{other + ".blob"});
}

TEST(ContentStoreTest, RejectsBadConfig) {
  EXPECT_EQ(ContentStore::Create({.suffix = ".blob"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ContentStore::Create({.directory = Dir("bad")}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ContentStore::Create({.directory = Dir("bad"), .suffix = ".partial"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::string file = Dir("file");
  fs::create_directories(fs::path(file).parent_path());
  std::ofstream(file) << "a file, not a directory";
  EXPECT_EQ(ContentStore::Create({.directory = file, .suffix = ".blob"}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ContentStoreTest, CorruptEntryIsDeletedOnRead) {
  auto store = ContentStore::Create({.directory = Dir("corrupt"), .suffix = ".blob"}).value();
  const std::string sha = store->Put("precious bytes").value();
  std::ofstream(store->PathOf(sha)) << "tampered";
  const absl::StatusOr<std::string> read = store->Read(sha);
  EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(fs::exists(store->PathOf(sha)));
  EXPECT_FALSE(store->Has(sha));
  EXPECT_EQ(store->bytes(), 0);
  // Put again restores it.
  EXPECT_EQ(store->Put("precious bytes").value(), sha);
  EXPECT_EQ(store->Read(sha).value(), "precious bytes");
  // A file deleted behind the store's back is NOT_FOUND, and forgotten.
  fs::remove(store->PathOf(sha));
  EXPECT_EQ(store->Read(sha).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(store->Has(sha));
}

TEST(ContentStoreTest, EvictsLeastRecentlyUsedAndRemembersRecencyAcrossRestarts) {
  const std::string dir = Dir("lru");
  FakeClock clock;
  ContentStore::Config config{.directory = dir, .suffix = ".blob", .max_bytes = 250,
                              .clock = &clock};
  auto store = ContentStore::Create(config).value();
  const std::string a = store->Put(std::string(100, 'a')).value();
  clock.Advance(absl::Seconds(1));
  const std::string b = store->Put(std::string(100, 'b')).value();
  clock.Advance(absl::Seconds(1));
  ASSERT_TRUE(store->Read(a).ok());  // a is now more recent than b
  clock.Advance(absl::Seconds(1));
  const std::string c = store->Put(std::string(100, 'c')).value();
  EXPECT_TRUE(store->Has(a));
  EXPECT_FALSE(store->Has(b)) << "b was the least recently used";
  EXPECT_TRUE(store->Has(c));
  EXPECT_EQ(store->bytes(), 200);
  EXPECT_FALSE(fs::exists(store->PathOf(b)));

  // A restart reads recency from the mtimes: with a smaller cap, a (older) goes, c stays.
  store.reset();
  config.max_bytes = 150;
  store = ContentStore::Create(config).value();
  EXPECT_EQ(store->List(), std::vector<std::string>{c});
  EXPECT_EQ(store->bytes(), 100);
}

TEST(ContentStoreTest, KeepsRecentlyUsedEntriesOverTheCap) {
  FakeClock clock;
  auto store = ContentStore::Create({.directory = Dir("recent"), .suffix = ".blob",
                                     .max_bytes = 100, .keep_recent = absl::Minutes(10),
                                     .clock = &clock})
                   .value();
  const std::string a = store->Put(std::string(100, 'a')).value();
  const std::string b = store->Put(std::string(100, 'b')).value();
  EXPECT_TRUE(store->Has(a));
  EXPECT_TRUE(store->Has(b));
  EXPECT_EQ(store->bytes(), 200);
  clock.Advance(absl::Minutes(11));
  const std::string c = store->Put(std::string(50, 'c')).value();
  EXPECT_FALSE(store->Has(a));
  EXPECT_FALSE(store->Has(b));
  EXPECT_TRUE(store->Has(c));
}

TEST(ContentStoreTest, InstallMakesACallersTempFileAnEntry) {
  const std::string dir = Dir("install");
  auto store = ContentStore::Create({.directory = dir, .suffix = ".blob"}).value();
  const std::string bytes = "written by the caller";
  const std::string sha = Sha256Hex(bytes);
  const std::string temp = store->TempPath(sha);
  EXPECT_NE(temp, store->TempPath(sha)) << "each temp path is new";
  std::ofstream(temp) << bytes;
  EXPECT_FALSE(store->Has(sha));
  ASSERT_TRUE(store->Install(sha, temp).ok());
  EXPECT_TRUE(store->Has(sha));
  EXPECT_EQ(store->Read(sha).value(), bytes);
  EXPECT_EQ(Names(dir), std::vector<std::string>{sha + ".blob"});
  EXPECT_EQ(store->Install(sha, temp).code(), absl::StatusCode::kNotFound);
  const std::string bad_temp = store->TempPath("x");
  std::ofstream(bad_temp) << bytes;
  EXPECT_EQ(store->Install("x", bad_temp).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(bad_temp)) << "the temp file is gone either way";
}

// What a crash leaves: temp files. Deleted, or with recover_temp_files installed when they
// hash to the sha256 their name starts with. Files of other names are left alone.
TEST(ContentStoreTest, CreateDeletesOrRecoversTempFiles) {
  for (const bool recover : {false, true}) {
    SCOPED_TRACE(recover ? "recover" : "delete");
    const std::string dir = Dir(recover ? "recover" : "delete");
    fs::create_directories(dir);
    const std::string intact = "complete before the crash", torn = "torn by the crash";
    std::ofstream(absl::StrCat(dir, "/", Sha256Hex(intact), ".partial.42.0")) << intact;
    std::ofstream(absl::StrCat(dir, "/", Sha256Hex(torn), ".partial.42.1")) << torn.substr(0, 4);
    std::ofstream(absl::StrCat(dir, "/", Sha256Hex("old"), ".blob.partial")) << "old";
    std::ofstream(dir + "/README") << "not an entry";
    auto store = ContentStore::Create(
                     {.directory = dir, .suffix = ".blob", .recover_temp_files = recover})
                     .value();
    std::vector<std::string> expected = {"README"};
    if (recover) {
      expected.push_back(Sha256Hex(intact) + ".blob");
      EXPECT_EQ(store->Read(Sha256Hex(intact)).value(), intact);
    }
    std::sort(expected.begin(), expected.end());
    EXPECT_EQ(Names(dir), expected);
    EXPECT_EQ(store->List().size(), recover ? 1u : 0u);
  }
}

TEST(DurableFileTest, WritesReadsAndHashes) {
  const std::string path = Dir("durable");
  fs::create_directories(fs::path(path).parent_path());
  const std::string bytes(3 * 1024 * 1024 + 7, 'd');
  const absl::Time mtime = absl::FromUnixSeconds(1700000000);
  const int fd = WriteDurableFile(path, bytes, mtime).value();
  EXPECT_EQ(Sha256OfFd(fd, bytes.size()).value(), Sha256Hex(bytes));
  char tail[4];
  ASSERT_TRUE(PreadFull(fd, tail, 4, bytes.size() - 4).ok());
  EXPECT_EQ(PreadFull(fd, tail, 4, bytes.size() - 2).code(), absl::StatusCode::kDataLoss);
  struct stat st;
  ASSERT_EQ(::fstat(fd, &st), 0);
  EXPECT_EQ(absl::TimeFromTimespec(st.st_mtim), mtime);
  ::close(fd);
  EXPECT_FALSE(WriteDurableFile(path, "again", std::nullopt).ok()) << "never overwrites";
  EXPECT_EQ(FsyncFile(path), 0);
  EXPECT_TRUE(IsSha256Hex(Sha256Hex("x")));
  EXPECT_FALSE(IsSha256Hex(std::string(64, 'A')));
  EXPECT_EQ(ErrnoStatus(ENOSPC, "write").code(), absl::StatusCode::kResourceExhausted);
}

}  // namespace
}  // namespace meshrun
