#include "worker/executable_store.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace meshrun::worker {
namespace {

std::unique_ptr<ExecutableStore> NewStore(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/executable_store_test/" + name;
  std::filesystem::remove_all(dir);
  return ExecutableStore::Create(dir).value();
}

TEST(ExecutableStoreTest, ChunkedUploadBecomesVisibleWhenVerified) {
  auto store = NewStore("ok");
  const std::string bytes(2500000, 'x');
  const std::string fp = Sha256Hex(bytes);
  auto upload = store->Begin(fp, static_cast<int64_t>(bytes.size())).value();
  for (size_t offset = 0; offset < bytes.size(); offset += ExecutableStore::kMaxChunkBytes) {
    ASSERT_TRUE(upload->Append(static_cast<int64_t>(offset),
                               absl::string_view(bytes).substr(offset, ExecutableStore::kMaxChunkBytes))
                    .ok());
    EXPECT_FALSE(store->Has(fp)) << "not visible before commit";
  }
  ASSERT_TRUE(upload->Commit(fp).ok());
  EXPECT_TRUE(store->Has(fp));
  EXPECT_EQ(store->Read(fp).value(), bytes);
  EXPECT_EQ(store->Fingerprints(), std::vector<std::string>{fp});
  // The flusher makes it durable under its final name; nothing else is left in the directory.
  store->Flush();
  const std::string dir = ::testing::TempDir() + "/executable_store_test/ok";
  EXPECT_TRUE(std::filesystem::exists(dir + "/" + fp + ".xexe"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir),
                          std::filesystem::directory_iterator()), 1);
  EXPECT_EQ(store->Read(fp).value(), bytes);
}

// What a crash leaves: an executable committed but not yet flushed is kept when it still
// hashes to its fingerprint; a torn one, or a transfer cut short, is deleted. A store that is
// destroyed flushes first.
TEST(ExecutableStoreTest, RestartKeepsIntactCommittedFilesAndDropsTornOnes) {
  const std::string dir = ::testing::TempDir() + "/executable_store_test/restart";
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string intact = "committed before the crash", torn = "flushed only in part";
  auto leave = [&](const std::string& fingerprint, const std::string& contents, int n) {
    std::ofstream(absl::StrCat(dir, "/", fingerprint, ".partial.4242.", n)) << contents;
  };
  leave(Sha256Hex(intact), intact, 0);
  leave(Sha256Hex(torn), torn.substr(0, 7), 1);
  leave("not-a-fingerprint", "", 2);
  const std::string flushed_on_exit = "flushed as the store goes";
  {
    auto store = ExecutableStore::Create(dir).value();
    EXPECT_EQ(store->Fingerprints(), std::vector<std::string>{Sha256Hex(intact)});
    EXPECT_EQ(store->Read(Sha256Hex(intact)).value(), intact);
    EXPECT_FALSE(store->Has(Sha256Hex(torn)));
    const std::string fp = Sha256Hex(flushed_on_exit);
    auto upload = store->Begin(fp, static_cast<int64_t>(flushed_on_exit.size())).value();
    ASSERT_TRUE(upload->Append(0, flushed_on_exit).ok());
    ASSERT_TRUE(upload->Commit(fp).ok());
  }
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  std::vector<std::string> expected = {Sha256Hex(intact) + ".xexe",
                                       Sha256Hex(flushed_on_exit) + ".xexe"};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
}

TEST(ExecutableStoreTest, TruncatedCorruptOrDisorderedTransfersLeaveNothing) {
  auto store = NewStore("bad");
  const std::string bytes = "serialized executable";
  const std::string fp = Sha256Hex(bytes);
  {
    auto upload = store->Begin(fp, static_cast<int64_t>(bytes.size())).value();
    ASSERT_TRUE(upload->Append(0, bytes.substr(0, 5)).ok());
    EXPECT_EQ(upload->Commit(fp).code(), absl::StatusCode::kDataLoss);
  }
  {
    auto upload = store->Begin(fp, static_cast<int64_t>(bytes.size())).value();
    std::string corrupt = bytes;
    corrupt[3] ^= 1;
    ASSERT_TRUE(upload->Append(0, corrupt).ok());
    const absl::Status status = upload->Commit(fp);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(status.message().find("checksum mismatch"), absl::string_view::npos);
  }
  {
    auto upload = store->Begin(fp, static_cast<int64_t>(bytes.size())).value();
    EXPECT_EQ(upload->Append(4, bytes).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(upload->Append(0, std::string(ExecutableStore::kMaxChunkBytes + 1, 'x')).code(),
              absl::StatusCode::kInvalidArgument);
  }
  EXPECT_FALSE(store->Has(fp));
  EXPECT_TRUE(store->Fingerprints().empty());
  EXPECT_EQ(store->Begin("not-a-sha", 3).status().code(), absl::StatusCode::kInvalidArgument);
}

// More chunks than the upload queues, handed over by pointer the way the worker's gRPC
// handler does (appending only when HasRoomOrNotify says so or has woken it): they are written
// in order and each Append leaves the caller's string empty for the next chunk.
TEST(ExecutableStoreTest, HandedOverChunksAreWrittenInOrder) {
  auto store = NewStore("handover");
  const int64_t chunk = ExecutableStore::kMaxChunkBytes;
  std::string bytes;
  for (int i = 0; i < 3 * ExecutableStore::Upload::kMaxQueuedChunks; ++i) {
    bytes.append(static_cast<size_t>(chunk), static_cast<char>('a' + i));
  }
  bytes.append("tail");
  const std::string fp = Sha256Hex(bytes);
  auto upload = store->Begin(fp, static_cast<int64_t>(bytes.size())).value();
  std::string buffer;
  for (size_t offset = 0; offset < bytes.size(); offset += static_cast<size_t>(chunk)) {
    buffer.assign(bytes, offset, static_cast<size_t>(chunk));
    ASSERT_TRUE(upload->Append(static_cast<int64_t>(offset), &buffer).ok());
    EXPECT_TRUE(buffer.empty());
    absl::Notification room;
    if (!upload->HasRoomOrNotify([&room] { room.Notify(); })) {
      ASSERT_TRUE(room.WaitForNotificationWithTimeout(absl::Seconds(30)))
          << "the upload never made room";
    }
  }
  EXPECT_EQ(upload->received(), static_cast<int64_t>(bytes.size()));
  ASSERT_TRUE(upload->Commit(fp).ok());
  EXPECT_EQ(store->Read(fp).value(), bytes);
  EXPECT_EQ(upload->Append(static_cast<int64_t>(bytes.size()), "").code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(upload->Commit(fp).code(), absl::StatusCode::kFailedPrecondition);
}

// An upload dropped with chunks still queued (the stream broke) leaves no file at all.
TEST(ExecutableStoreTest, AbandonedUploadLeavesNoFile) {
  auto store = NewStore("abandoned");
  const std::string dir = ::testing::TempDir() + "/executable_store_test/abandoned";
  const std::string bytes(8 * ExecutableStore::kMaxChunkBytes, 'q');
  const std::string fp = Sha256Hex(bytes);
  {
    auto upload = store->Begin(fp, static_cast<int64_t>(bytes.size())).value();
    for (int64_t offset = 0; offset < 6 * ExecutableStore::kMaxChunkBytes;
         offset += ExecutableStore::kMaxChunkBytes) {
      ASSERT_TRUE(upload->Append(offset, absl::string_view(bytes).substr(
                                             offset, ExecutableStore::kMaxChunkBytes))
                      .ok());
    }
  }
  EXPECT_FALSE(store->Has(fp));
  EXPECT_TRUE(std::filesystem::is_empty(dir));
}

// Verify::kOnRead (a transport that authenticates every byte): the upload does not hash, so
// bytes that do not match the fingerprint are committed, and Read is what catches them (and
// deletes the file); matching bytes read back as sent. An announced sha256 other than the
// fingerprint is still refused at Commit.
TEST(ExecutableStoreTest, VerifyOnReadLeavesTheHashToRead) {
  auto store = NewStore("verify_on_read");
  const std::string bytes(1500000, 'v');
  const std::string fp = Sha256Hex(bytes);
  using Verify = ExecutableStore::Verify;
  auto good = store->Begin(fp, static_cast<int64_t>(bytes.size()), Verify::kOnRead).value();
  ASSERT_TRUE(good->Append(0, absl::string_view(bytes).substr(0, ExecutableStore::kMaxChunkBytes)).ok());
  ASSERT_TRUE(good->Append(ExecutableStore::kMaxChunkBytes,
                           absl::string_view(bytes).substr(ExecutableStore::kMaxChunkBytes))
                  .ok());
  ASSERT_TRUE(good->Commit(fp).ok());
  EXPECT_EQ(store->Read(fp).value(), bytes);

  const std::string other(10, 'o'), other_fp = Sha256Hex(other);
  auto named_wrong = store->Begin(other_fp, 10, Verify::kOnRead).value();
  ASSERT_TRUE(named_wrong->Append(0, "0123456789").ok());
  EXPECT_EQ(named_wrong->Commit(Sha256Hex("0123456789")).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(store->Has(other_fp));

  auto lying = store->Begin(other_fp, 10, Verify::kOnRead).value();
  ASSERT_TRUE(lying->Append(0, "0123456789").ok());
  ASSERT_TRUE(lying->Commit(other_fp).ok());
  EXPECT_EQ(store->Read(other_fp).status().code(), absl::StatusCode::kDataLoss);
  store->Flush();
  EXPECT_FALSE(store->Has(other_fp)) << "Read deletes what does not match its fingerprint";
}

}  // namespace
}  // namespace meshrun::worker
