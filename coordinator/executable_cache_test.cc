#include "coordinator/executable_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/sha256.h"

namespace meshrun::coordinator {
namespace {

namespace fs = std::filesystem;
using Outcome = ExecutableCache::Outcome;

runtime::RuntimeIdentity Identity() {
  return {.platform_name = "tpu", .platform_version = "0.0.37", .pjrt_api_major = 0,
          .pjrt_api_minor = 67, .plugin_sha256 = std::string(64, 'a')};
}

std::string Key(int n) { return CacheKey(absl::StrCat("program ", n), "opts", {0, 1}, Identity()); }

std::vector<fs::path> EntryFiles(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() == ".xexe") files.push_back(entry.path());
  }
  return files;
}

TEST(CacheKeyTest, EveryInputChangesTheKeyAndTheEncodingIsUnambiguous) {
  const std::vector<int32_t> devices = {0, 1, 2, 3};
  const std::string base = CacheKey("program", "options", devices, Identity());
  EXPECT_EQ(base.size(), 64u);
  EXPECT_EQ(base, CacheKey("program", "options", devices, Identity())) << "deterministic";

  std::set<std::string> keys = {base};
  auto differs = [&](const std::string& key, const std::string& what) {
    EXPECT_TRUE(keys.insert(key).second) << what << " did not change the key";
  };
  differs(CacheKey("program!", "options", devices, Identity()), "program");
  differs(CacheKey("program", "options2", devices, Identity()), "compile options");
  differs(CacheKey("program", "options", std::vector<int32_t>{0, 1, 3, 2}, Identity()),
          "device order");
  differs(CacheKey("program", "options", std::vector<int32_t>{0, 1, 2}, Identity()),
          "device count");
  for (int field = 0; field < 5; ++field) {
    runtime::RuntimeIdentity identity = Identity();
    switch (field) {
      case 0: identity.platform_name = "cpu"; break;
      case 1: identity.platform_version = "0.0.36"; break;
      case 2: identity.pjrt_api_major = 1; break;
      case 3: identity.pjrt_api_minor = 68; break;
      case 4: identity.plugin_sha256 = std::string(64, 'b'); break;
    }
    differs(CacheKey("program", "options", devices, identity), absl::StrCat("identity field ", field));
  }
  // Moving bytes across a boundary changes the key (length prefixes).
  differs(CacheKey("programo", "ptions", devices, Identity()), "program/options boundary");
  runtime::RuntimeIdentity shifted = Identity();
  shifted.platform_name = "tpu0";
  shifted.platform_version = ".0.37";
  differs(CacheKey("program", "options", devices, shifted), "identity field boundary");
  differs(CacheKey("", "", {}, {}), "all empty");
  differs(CacheKey("", "", std::vector<int32_t>{0}, {}), "one device 0");
}

class ExecutableCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           absl::StrCat("executable_cache_test_", ::getpid(), "_",
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<ExecutableCache> Open(uint64_t max_bytes = uint64_t{1} << 30) {
    auto cache = ExecutableCache::Create(
        {.directory = dir_.string(), .max_bytes = max_bytes, .clock = &clock_});
    EXPECT_TRUE(cache.ok()) << cache.status();
    return cache.ok() ? std::move(*cache) : nullptr;
  }

  static std::string Read(const std::optional<CachedExecutable>& entry) {
    EXPECT_TRUE(entry.has_value());
    if (!entry.has_value()) return "";
    absl::StatusOr<std::string> bytes = entry->ReadAll();
    EXPECT_TRUE(bytes.ok()) << bytes.status();
    return bytes.ok() ? *bytes : "";
  }

  fs::path dir_;
  FakeClock clock_;
};

TEST_F(ExecutableCacheTest, MissThenInsertThenHit) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  auto miss = cache->Lookup(Key(1));
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->has_value());

  ASSERT_TRUE(cache->Insert(Key(1), "executable one").ok());
  auto hit = cache->Lookup(Key(1));
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ(Read(*hit), "executable one");
  EXPECT_EQ((*hit)->sha256(), Sha256Hex("executable one"));
  EXPECT_EQ((*hit)->size(), 14u);
  EXPECT_EQ(cache->Size(), 14u);
  EXPECT_EQ(cache->EntryCount(), 1u);

  // Replacing a key keeps one file and the new contents.
  ASSERT_TRUE(cache->Insert(Key(1), "executable 1, again").ok());
  EXPECT_EQ(Read(*cache->Lookup(Key(1))), "executable 1, again");
  EXPECT_EQ(cache->Size(), 19u);
  EXPECT_EQ(EntryFiles(dir_).size(), 1u);
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_NE(entry.path().filename().string().rfind(".tmp.", 0), 0u) << entry.path();
  }
}

TEST_F(ExecutableCacheTest, RejectsBadKeysAndSecondUserOfTheDirectory) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->Lookup("../etc/passwd").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->Insert(std::string(64, 'A'), "x").code(), absl::StatusCode::kInvalidArgument);
  auto second = ExecutableCache::Create({.directory = dir_.string(), .clock = &clock_});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ExecutableCache::Create({.directory = ""}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(ExecutableCacheTest, EntriesSurviveRestart) {
  {
    auto cache = Open();
    ASSERT_NE(cache, nullptr);
    ASSERT_TRUE(cache->Insert(Key(1), "one").ok());
    ASSERT_TRUE(cache->Insert(Key(2), "second").ok());
  }
  // Files that are not entries are left alone.
  std::ofstream(dir_ / "README") << "not an entry";
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->EntryCount(), 2u);
  EXPECT_EQ(cache->Size(), 9u);
  EXPECT_EQ(Read(*cache->Lookup(Key(1))), "one");
  EXPECT_EQ(Read(*cache->Lookup(Key(2))), "second");
  EXPECT_TRUE(fs::exists(dir_ / "README"));
}

TEST_F(ExecutableCacheTest, CorruptEntryIsDeletedMissedAndRecompiled) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Insert(Key(1), "a serialized executable").ok());
  ASSERT_TRUE(cache->Insert(Key(2), "another one").ok());
  std::vector<fs::path> files = EntryFiles(dir_);
  ASSERT_EQ(files.size(), 2u);
  const fs::path victim = files[0].filename().string().substr(0, 64) == Key(1) ? files[0] : files[1];
  {  // flip one byte in place
    std::fstream f(victim, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(5);
    f.put('X');
  }
  auto lookup = cache->Lookup(Key(1));
  ASSERT_TRUE(lookup.ok()) << lookup.status();
  EXPECT_FALSE(lookup->has_value()) << "corrupt entry must be a miss";
  EXPECT_FALSE(fs::exists(victim)) << "corrupt entry must be deleted";
  EXPECT_EQ(cache->EntryCount(), 1u);
  EXPECT_EQ(cache->Size(), 11u);

  int compiles = 0;
  auto compile = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    return std::string("a serialized executable");
  };
  auto result = cache->GetOrCompile(Key(1), compile);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->outcome, Outcome::kCompiled);
  EXPECT_EQ(compiles, 1);
  result = cache->GetOrCompile(Key(1), compile);
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->outcome, Outcome::kHit);
  EXPECT_EQ(compiles, 1);
  EXPECT_EQ(*result->executable.ReadAll(), "a serialized executable");

  // Corruption found after a restart (a truncated file) is handled the same way.
  cache.reset();
  for (const fs::path& file : EntryFiles(dir_)) fs::resize_file(file, 3);
  cache = Open();
  ASSERT_NE(cache, nullptr);
  EXPECT_FALSE(cache->Lookup(Key(2))->has_value());
  EXPECT_FALSE(cache->Lookup(Key(1))->has_value());
  EXPECT_TRUE(EntryFiles(dir_).empty());
  EXPECT_EQ(cache->Size(), 0u);
}

TEST_F(ExecutableCacheTest, EvictsLeastRecentlyUsedAndRemembersRecencyAcrossRestarts) {
  const std::string hundred(100, 'x');
  auto cache = Open(/*max_bytes=*/300);
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Insert(Key(1), hundred).ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(cache->Insert(Key(2), hundred).ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(cache->Insert(Key(3), hundred).ok());
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(cache->Lookup(Key(1))->has_value());  // 1 is now the most recent
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(cache->Insert(Key(4), hundred).ok());  // over budget: evicts 2
  EXPECT_EQ(cache->Size(), 300u);
  EXPECT_FALSE(cache->Lookup(Key(2))->has_value());
  std::vector<ExecutableCache::EntryInfo> list = cache->List();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].key, Key(4));
  EXPECT_EQ(list[1].key, Key(1));
  EXPECT_EQ(list[2].key, Key(3));
  EXPECT_EQ(EntryFiles(dir_).size(), 3u);

  // After a restart the order is the same (file mtimes), so 3 goes next.
  cache.reset();
  cache = Open(/*max_bytes=*/300);
  ASSERT_NE(cache, nullptr);
  list = cache->List();
  ASSERT_EQ(list.size(), 3u);
  EXPECT_EQ(list[0].key, Key(4));
  EXPECT_EQ(list[1].key, Key(1));
  EXPECT_EQ(list[2].key, Key(3));
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(cache->Insert(Key(5), hundred).ok());
  EXPECT_FALSE(cache->Lookup(Key(3))->has_value());
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(cache->Lookup(Key(1))->has_value());

  // A smaller budget on restart trims to fit, oldest first.
  cache.reset();
  cache = Open(/*max_bytes=*/150);
  ASSERT_NE(cache, nullptr);
  ASSERT_EQ(cache->EntryCount(), 1u);
  EXPECT_EQ(cache->List()[0].key, Key(1)) << "1 was looked up last";
  EXPECT_EQ(EntryFiles(dir_).size(), 1u);
}

TEST_F(ExecutableCacheTest, OversizedExecutableIsReturnedButNotStored) {
  auto cache = Open(/*max_bytes=*/10);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->Insert(Key(1), std::string(11, 'x')).code(),
            absl::StatusCode::kResourceExhausted);
  auto result = cache->GetOrCompile(Key(1), [] { return absl::StatusOr<std::string>("0123456789ab"); });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_FALSE(result->stored);
  EXPECT_TRUE(result->executable.path().empty());
  EXPECT_EQ(*result->executable.ReadAll(), "0123456789ab");
  EXPECT_EQ(cache->Size(), 0u);
  EXPECT_TRUE(EntryFiles(dir_).empty());
}

TEST_F(ExecutableCacheTest, ReportsCompileTimeFromTheClock) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  auto result = cache->GetOrCompile(Key(1), [&]() -> absl::StatusOr<std::string> {
    clock_.Advance(absl::Seconds(42));
    return std::string("exe");
  });
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->outcome, Outcome::kCompiled);
  EXPECT_EQ(result->compile_time, absl::Seconds(42));
  EXPECT_TRUE(result->stored);
  EXPECT_EQ(result->executable.sha256(), Sha256Hex("exe"));
}

TEST_F(ExecutableCacheTest, ConcurrentCallersCompileEachKeyOnce) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  std::atomic<int> compiles_a{0}, compiles_b{0};
  constexpr int kThreads = 8;
  std::vector<absl::StatusOr<ExecutableCache::GetOrCompileResult>> results(
      kThreads, absl::UnknownError("not run"));
  absl::Notification go;
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      go.WaitForNotification();
      std::atomic<int>& counter = i % 2 == 0 ? compiles_a : compiles_b;
      results[i] = cache->GetOrCompile(Key(i % 2), [&, i]() -> absl::StatusOr<std::string> {
        ++counter;
        absl::SleepFor(absl::Milliseconds(300));  // let the others pile up
        return absl::StrCat("executable ", i % 2);
      });
    });
  }
  go.Notify();
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(compiles_a.load(), 1);
  EXPECT_EQ(compiles_b.load(), 1);
  int compiled = 0;
  for (int i = 0; i < kThreads; ++i) {
    ASSERT_TRUE(results[i].ok()) << results[i].status();
    EXPECT_EQ(*results[i]->executable.ReadAll(), absl::StrCat("executable ", i % 2));
    if (results[i]->outcome == Outcome::kCompiled) ++compiled;
  }
  EXPECT_EQ(compiled, 2) << "one compile per key; the rest joined or hit";
  EXPECT_EQ(cache->EntryCount(), 2u);
}

TEST_F(ExecutableCacheTest, ConcurrentCallersShareACompileErrorAndTheNextCallRetries) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  std::atomic<int> compiles{0};
  absl::Notification entered, release;
  auto failing = [&]() -> absl::StatusOr<std::string> {
    ++compiles;
    entered.Notify();
    release.WaitForNotification();
    return absl::InternalError("compiler crashed");
  };
  absl::StatusOr<ExecutableCache::GetOrCompileResult> first = absl::UnknownError("");
  absl::StatusOr<ExecutableCache::GetOrCompileResult> second = absl::UnknownError("");
  std::thread leader([&] { first = cache->GetOrCompile(Key(7), failing); });
  entered.WaitForNotification();
  std::thread joiner([&] { second = cache->GetOrCompile(Key(7), failing); });
  absl::SleepFor(absl::Milliseconds(100));  // the joiner is now waiting on the flight
  release.Notify();
  leader.join();
  joiner.join();
  EXPECT_EQ(first.status().message(), "compiler crashed");
  EXPECT_EQ(second.status().message(), "compiler crashed");
  EXPECT_EQ(compiles.load(), 1);

  auto retry = cache->GetOrCompile(Key(7), [] { return absl::StatusOr<std::string>("ok now"); });
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->outcome, Outcome::kCompiled);
}

TEST_F(ExecutableCacheTest, ChunksCoverTheWholeEntry) {
  auto cache = Open();
  ASSERT_NE(cache, nullptr);
  std::string bytes;
  for (int i = 0; i < 3 * 1024 * 1024 + 17; ++i) bytes.push_back(static_cast<char>(i * 131));
  ASSERT_TRUE(cache->Insert(Key(1), bytes).ok());
  auto entry = cache->Lookup(Key(1));
  ASSERT_TRUE(entry.ok() && entry->has_value());
  std::string joined;
  size_t chunks = 0;
  ASSERT_TRUE((*entry)->ForEachChunk(1 << 20, [&](absl::string_view chunk) {
                        EXPECT_LE(chunk.size(), size_t{1} << 20);
                        joined.append(chunk.data(), chunk.size());
                        ++chunks;
                        return absl::OkStatus();
                      })
                  .ok());
  EXPECT_EQ(chunks, 4u);
  EXPECT_EQ(joined, bytes);
  EXPECT_EQ(*(*entry)->ReadAt(bytes.size() - 5, 100), bytes.substr(bytes.size() - 5));
  EXPECT_EQ((*entry)->ReadAt(bytes.size() + 1, 1).status().code(), absl::StatusCode::kOutOfRange);
  // The handle outlives eviction of its file.
  fs::remove(dir_ / (Key(1) + "." + Sha256Hex(bytes) + ".xexe"));
  EXPECT_EQ(*(*entry)->ReadAt(0, 3), bytes.substr(0, 3));
}

// A sparse entry past 4 GiB, placed on disk by hand: loading, verifying and reading at
// offsets beyond 2^31 and 2^32 must use 64-bit sizes end to end.
TEST_F(ExecutableCacheTest, EntriesPastFourGibUseSixtyFourBitOffsets) {
  fs::create_directories(dir_);
  const uint64_t size = (uint64_t{1} << 32) + (uint64_t{1} << 20);
  const uint64_t mark = (uint64_t{1} << 32) + 10;
  const fs::path staging = dir_ / "staging";
  {
    const int fd = ::open(staging.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, static_cast<off_t>(size)), 0);
    ASSERT_EQ(::pwrite(fd, "MARK", 4, static_cast<off_t>(mark)), 4);
    ASSERT_EQ(::pwrite(fd, "low", 3, (off_t{1} << 31) - 1), 3);
    struct stat st;
    ASSERT_EQ(::fstat(fd, &st), 0);
    ::close(fd);
    if (static_cast<uint64_t>(st.st_blocks) * 512 > size / 16) {
      GTEST_SKIP() << "filesystem does not keep sparse files; not writing 4 GiB for real";
    }
  }
  // sha256 of this exact layout (zeros, "low" at 2^31-1, "MARK" at 2^32+10), computed
  // independently with Python's hashlib, so the test reads the 4 GiB only once.
  const std::string sha = "ccd6d7062a6d1c82b77f31a19599a5ae51a1e5cd1a9be3796e0ad0f04d437bb0";
  fs::rename(staging, dir_ / (Key(9) + "." + sha + ".xexe"));

  auto cache = Open(/*max_bytes=*/uint64_t{8} << 30);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->Size(), size);
  auto entry = cache->Lookup(Key(9));
  ASSERT_TRUE(entry.ok()) << entry.status();
  ASSERT_TRUE(entry->has_value());
  EXPECT_EQ((*entry)->size(), size);
  EXPECT_EQ(*(*entry)->ReadAt(mark - 2, 8), std::string("\0\0MARK\0\0", 8));
  EXPECT_EQ(*(*entry)->ReadAt((uint64_t{1} << 31) - 2, 5), std::string("\0low\0", 5));
  EXPECT_EQ((*entry)->ReadAt(size - 3, 1 << 20)->size(), 3u);
  EXPECT_EQ((*entry)->ReadAt(size + 1, 1).status().code(), absl::StatusCode::kOutOfRange);

  // A budget below its size evicts it on the next start.
  entry->reset();
  cache.reset();
  cache = Open(/*max_bytes=*/uint64_t{1} << 32);
  ASSERT_NE(cache, nullptr);
  EXPECT_EQ(cache->EntryCount(), 0u);
  EXPECT_TRUE(EntryFiles(dir_).empty());
}

// Writes and reads back a real 2.1 GiB entry. Slow and needs ~5 GiB of memory and disk:
// runs only with MESHRUN_LARGE_TESTS=1.
TEST_F(ExecutableCacheTest, InsertAndReadBackAboveTwoGib) {
  if (std::getenv("MESHRUN_LARGE_TESTS") == nullptr) GTEST_SKIP() << "set MESHRUN_LARGE_TESTS=1";
  const size_t size = (size_t{1} << 31) + (size_t{100} << 20);
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; i += 4096) bytes[i] = static_cast<char>(i >> 12);
  const std::string sha = Sha256Hex(bytes);
  auto cache = Open(/*max_bytes=*/uint64_t{4} << 30);
  ASSERT_NE(cache, nullptr);
  ASSERT_TRUE(cache->Insert(Key(3), bytes).ok());
  bytes.clear();
  bytes.shrink_to_fit();
  EXPECT_EQ(fs::file_size(dir_ / (Key(3) + "." + sha + ".xexe")), size);
  auto entry = cache->Lookup(Key(3));
  ASSERT_TRUE(entry.ok() && entry->has_value());
  Sha256 hasher;
  ASSERT_TRUE((*entry)->ForEachChunk(1 << 20, [&](absl::string_view chunk) {
                        hasher.Update(chunk);
                        return absl::OkStatus();
                      })
                  .ok());
  EXPECT_EQ(hasher.HexDigest(), sha);
}

TEST_F(ExecutableCacheTest, StaleTempFilesAreRemovedOnStart) {
  fs::create_directories(dir_);
  std::ofstream(dir_ / ".tmp.old") << "half written";
  std::ofstream(dir_ / ".tmp.fresh") << "being written";
  const fs::file_time_type now = fs::last_write_time(dir_ / ".tmp.fresh");
  fs::last_write_time(dir_ / ".tmp.old", now - std::chrono::hours(2));
  auto cache = ExecutableCache::Create({.directory = dir_.string()});  // real clock
  ASSERT_TRUE(cache.ok()) << cache.status();
  EXPECT_FALSE(fs::exists(dir_ / ".tmp.old"));
  EXPECT_TRUE(fs::exists(dir_ / ".tmp.fresh"));
}

}  // namespace
}  // namespace meshrun::coordinator
