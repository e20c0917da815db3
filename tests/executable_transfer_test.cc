// Executable transfers as the coordinator makes them, to a real worker on 127.0.0.1:0:
// an artifact above 2 GiB arrives whole and verified; a corrupt or truncated stream is
// refused with DATA_LOSS and leaves nothing in the worker's store, by its chunks' CRC-32C or
// (from a sender without them) by its sha256; with CRCs the sha256 is checked on load.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/match.h"
#include "common/crc32c.h"
#include "common/sha256.h"
#include "coordinator/executable_cache.h"
#include "coordinator_service/executable_transfer.h"
#include "rpc/server_support.h"
#include "worker_service/worker_server.h"

namespace meshrun::services {
namespace {

std::string Dir(const std::string& name) {
  return ::testing::TempDir() + "/executable_transfer_test/" + name;
}

// Incompressible bytes, cheap to make.
std::string PseudoRandomBytes(size_t size) {
  std::string bytes(size, '\0');
  uint64_t x = 0x2545F4914F6CDD1DULL;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, 8);
  }
  for (; i < size; ++i) bytes[i] = static_cast<char>(i);
  return bytes;
}

class ExecutableTransferTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::filesystem::remove_all(Dir(""));
    // No coordinator listens on port 1: the worker keeps retrying registration, which does
    // not matter to LoadExecutable.
    auto worker = WorkerServer::Start({.listen = "127.0.0.1:0",
                                       .coordinator = "127.0.0.1:1",
                                       .identity = {.host = "transfer-worker"},
                                       .state_dir = Dir("worker")});
    ASSERT_TRUE(worker.ok()) << worker.status();
    worker_ = std::move(*worker);
    channel_ = MakeChannel("127.0.0.1:" + std::to_string(worker_->port()));
    stub_ = v1::Worker::NewStub(channel_);
  }
  void TearDown() override {
    if (worker_ != nullptr) worker_->Drain(absl::Seconds(1));
    std::filesystem::remove_all(Dir(""));
  }
  std::string StoredPath(const std::string& fingerprint) {
    return Dir("worker") + "/executables/" + fingerprint + ".xexe";
  }
  size_t StoredFiles() {
    size_t n = 0;
    for (const auto& f : std::filesystem::directory_iterator(Dir("worker") + "/executables")) {
      n += f.is_regular_file();
    }
    return n;
  }

  std::unique_ptr<WorkerServer> worker_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Worker::Stub> stub_;
};

TEST_F(ExecutableTransferTest, ArtifactAboveTwoGibArrivesWholeAndVerified) {
  const size_t size = (size_t{2} << 30) + (size_t{1} << 20) + 7;  // past int32, odd last chunk
  std::string bytes = PseudoRandomBytes(size);
  auto cache = coordinator::ExecutableCache::Create({.directory = Dir("cache")});
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::string key = Sha256Hex("two gib");
  ASSERT_TRUE((*cache)->Insert(key, bytes).ok());
  const std::string digest = Sha256Hex(bytes);
  bytes.clear();
  bytes.shrink_to_fit();
  auto entry = (*cache)->Lookup(key);
  ASSERT_TRUE(entry.ok() && entry->has_value()) << entry.status();
  ASSERT_EQ((*entry)->size(), size);

  ASSERT_TRUE(SendExecutable(channel_, **entry).ok());
  // Acknowledged once verified; the worker's flusher then renames it into place (fsynced).
  for (int i = 0; i < 1200 && !std::filesystem::exists(StoredPath(digest)); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(std::filesystem::exists(StoredPath(digest))) << "not flushed within 60 s";
  EXPECT_EQ(std::filesystem::file_size(StoredPath(digest)), size);
  auto stored = Sha256File(StoredPath(digest));
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(*stored, digest);
  // Sending what the worker already holds is refused, so nothing is ever sent twice.
  EXPECT_EQ(SendExecutable(channel_, **entry).code(), absl::StatusCode::kAlreadyExists);
}

struct RawOptions {
  bool crc = false;               // every chunk carries its CRC-32C
  bool crc_first_only = false;    // only the first does
  int64_t flip_after_crc = -1;    // this byte is flipped after its chunk's CRC was taken
};

// Streams `bytes` in 1 MiB chunks, announcing `total` bytes and `sha256` at the end.
absl::Status SendRaw(v1::Worker::Stub& stub, const std::string& bytes, int64_t total,
                     const std::string& sha256, const RawOptions& options = {}) {
  auto context = ContextWithTimeout(absl::Seconds(30));
  v1::LoadExecutableResponse response;
  auto writer = stub.LoadExecutable(context.get(), &response);
  for (size_t offset = 0; offset < bytes.size(); offset += 1 << 20) {
    v1::LoadExecutableChunk chunk;
    if (offset == 0) {
      chunk.set_fingerprint(sha256);
      chunk.set_total_bytes(total);
    }
    chunk.set_offset(static_cast<int64_t>(offset));
    chunk.set_data(bytes.substr(offset, 1 << 20));
    if (options.crc || (options.crc_first_only && offset == 0)) {
      chunk.set_crc32c(Crc32c(chunk.data()));
    }
    const int64_t flip = options.flip_after_crc - static_cast<int64_t>(offset);
    if (flip >= 0 && flip < static_cast<int64_t>(chunk.data().size())) {
      (*chunk.mutable_data())[flip] ^= 0x40;  // corrupted on its way
    }
    if (offset + (1 << 20) >= bytes.size()) chunk.set_sha256(sha256);
    if (!writer->Write(chunk)) break;
  }
  writer->WritesDone();
  grpc::Status status = writer->Finish();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

TEST_F(ExecutableTransferTest, CorruptOrTruncatedTransfersAreRefusedAndLeaveNothing) {
  const std::string bytes = PseudoRandomBytes((3 << 20) + 11);
  const std::string digest = Sha256Hex(bytes);
  std::string corrupt = bytes;
  corrupt[(2 << 20) + 5] ^= 0x40;
  EXPECT_EQ(SendRaw(*stub_, corrupt, bytes.size(), digest).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(SendRaw(*stub_, bytes.substr(0, 2 << 20), bytes.size(), digest).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(StoredFiles(), 0u);
  // The intact stream afterwards is accepted.
  EXPECT_TRUE(SendRaw(*stub_, bytes, bytes.size(), digest).ok());
  EXPECT_EQ(StoredFiles(), 1u);
}

// Plaintext chunks carry a CRC-32C: a chunk corrupted in transit is refused with DATA_LOSS at
// once, and nothing is kept; a sender that starts with CRCs must keep sending them.
TEST_F(ExecutableTransferTest, ChunkCorruptedInTransitIsRefusedByItsCrc) {
  const std::string bytes = PseudoRandomBytes((3 << 20) + 11);
  const std::string digest = Sha256Hex(bytes);
  const absl::Status corrupted = SendRaw(*stub_, bytes, bytes.size(), digest,
                                         {.crc = true, .flip_after_crc = (1 << 20) + 5});
  EXPECT_EQ(corrupted.code(), absl::StatusCode::kDataLoss) << corrupted;
  EXPECT_TRUE(absl::StrContains(corrupted.message(), "chunk at offset 1048576 was corrupted"))
      << corrupted;
  const absl::Status mixed =
      SendRaw(*stub_, bytes, bytes.size(), digest, {.crc_first_only = true});
  EXPECT_EQ(mixed.code(), absl::StatusCode::kInvalidArgument) << mixed;
  EXPECT_TRUE(absl::StrContains(mixed.message(), "carries no crc32c")) << mixed;
  EXPECT_EQ(StoredFiles(), 0u);
  EXPECT_TRUE(SendRaw(*stub_, bytes, bytes.size(), digest, {.crc = true}).ok());
  EXPECT_EQ(StoredFiles(), 1u);
}

// With chunk CRCs the worker leaves the sha256 to the load, which refuses bytes that do not
// hash to their fingerprint (a sender that lied, or the disk) with DATA_LOSS and deletes them.
TEST_F(ExecutableTransferTest, WithChunkCrcsTheSha256IsCheckedOnLoad) {
  const std::string bytes = PseudoRandomBytes((2 << 20) + 3);
  const std::string claimed = Sha256Hex("something else");
  ASSERT_TRUE(SendRaw(*stub_, bytes, bytes.size(), claimed, {.crc = true}).ok());
  for (int i = 0; i < 200 && !std::filesystem::exists(StoredPath(claimed)); ++i) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  ASSERT_TRUE(std::filesystem::exists(StoredPath(claimed))) << "not flushed within 10 s";
  auto store = worker::ExecutableStore::Create(Dir("worker") + "/executables");
  ASSERT_TRUE(store.ok()) << store.status();
  absl::StatusOr<std::string> loaded = (*store)->Read(claimed);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss) << loaded.status();
  EXPECT_FALSE(std::filesystem::exists(StoredPath(claimed)));
}

// A cache file damaged after its lookup (here: shrunk) ends the transfer with DATA_LOSS,
// and the worker keeps nothing of the bytes it got.
TEST_F(ExecutableTransferTest, DamagedCacheFileEndsTheTransferAndLeavesNothing) {
  const std::string bytes = PseudoRandomBytes((3 << 20) + 11);
  auto cache = coordinator::ExecutableCache::Create({.directory = Dir("cache")});
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::string key = Sha256Hex("shrinks");
  ASSERT_TRUE((*cache)->Insert(key, bytes).ok());
  auto entry = (*cache)->Lookup(key);
  ASSERT_TRUE(entry.ok() && entry->has_value()) << entry.status();
  std::filesystem::resize_file((*entry)->path(), (3 << 20) / 2);

  const absl::Status sent = SendExecutable(channel_, **entry);
  EXPECT_EQ(sent.code(), absl::StatusCode::kDataLoss) << sent;
  // The sender cancelled the call; the worker drops its partial file as it sees the cancel.
  for (int i = 0; i < 500 && StoredFiles() > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  EXPECT_EQ(StoredFiles(), 0u);
}

// Chunk sizes the worker would refuse are refused before a call is made.
TEST_F(ExecutableTransferTest, ChunkSizeOutsideTheWorkersLimitIsRefused) {
  auto cache = coordinator::ExecutableCache::Create({.directory = Dir("cache")});
  ASSERT_TRUE(cache.ok()) << cache.status();
  const std::string key = Sha256Hex("chunked");
  ASSERT_TRUE((*cache)->Insert(key, PseudoRandomBytes(3 << 20)).ok());
  auto entry = (*cache)->Lookup(key);
  ASSERT_TRUE(entry.ok() && entry->has_value()) << entry.status();
  for (size_t chunk_bytes : {size_t{0}, (size_t{1} << 20) + 1}) {
    const absl::Status refused = SendExecutable(channel_, **entry, {.chunk_bytes = chunk_bytes});
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_NE(refused.message().find("chunk_bytes="), absl::string_view::npos) << refused;
  }
  EXPECT_EQ(StoredFiles(), 0u);
}

}  // namespace
}  // namespace meshrun::services
