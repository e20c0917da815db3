// In-memory checkpoints moving between hosts over real gRPC on loopback
// (worker_service/memory_checkpoint_transfer.h): a ring host copies its predecessor's snapshot
// once the predecessor has taken it, block for block and across pieces; a restoring host
// fetches the blocks it needs from the first holder that has them all, own copy or ring copy.
#include <gtest/gtest.h>

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "worker/memory_checkpoints.h"
#include "worker_service/memory_checkpoint_transfer.h"

namespace meshrun::services {
namespace {

// A host's memory tier as a worker serves it (Worker.FetchMemoryCheckpoint), alone.
class MemoryHolder final : public v1::Worker::CallbackService {
 public:
  MemoryHolder() {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(this);
    server_ = builder.BuildAndStart();
  }
  ~MemoryHolder() override {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  }
  grpc::ServerWriteReactor<v1::MemoryCheckpointPiece>* FetchMemoryCheckpoint(
      grpc::CallbackServerContext*, const v1::FetchMemoryCheckpointRequest* request) override {
    return ServeMemoryCheckpoint(store.Copies(request->job_id(), request->step()), *request);
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

  worker::MemoryCheckpointStore store;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

// A snapshot of step `step` whose blocks `keys` of array "w" each hold `bytes` bytes, filled
// from the key and the step so that every block differs.
std::shared_ptr<worker::MemorySnapshot> Snapshot(int64_t step, const std::vector<std::string>& keys,
                                                 int64_t bytes, const std::string& of_host = "") {
  auto snapshot = std::make_shared<worker::MemorySnapshot>();
  snapshot->job_id = "job-1";
  snapshot->step = step;
  snapshot->data_position = step * 4;
  snapshot->of_host = of_host;
  for (const std::string& key : keys) {
    std::string data(static_cast<size_t>(bytes), '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 31 + key[0] + step);
    snapshot->blocks["w"][key] =
        runtime::HostArray{{runtime::DType::kF32, {bytes / 4}}, std::move(data)};
  }
  return snapshot;
}

bool SameBlocks(const worker::MemorySnapshot& a, const worker::MemorySnapshot& b) {
  if (a.blocks.size() != b.blocks.size()) return false;
  for (const auto& [name, keyed] : a.blocks) {
    auto other = b.blocks.find(name);
    if (other == b.blocks.end() || other->second.size() != keyed.size()) return false;
    for (const auto& [key, block] : keyed) {
      auto it = other->second.find(key);
      if (it == other->second.end() || it->second.bytes != block.bytes ||
          it->second.shape.dims != block.shape.dims) {
        return false;
      }
    }
  }
  return true;
}

// The predecessor takes step 10 a little after this host asks for its copy (hosts of one
// program reach a step at about the same time): the copier waits for it, and keeps it as the
// predecessor's copy, beside this host's own. Blocks past 1 MiB cross several pieces.
TEST(MemoryCheckpointTransfer, ARingHostCopiesItsPredecessorsSnapshotOnceTaken) {
  MemoryHolder predecessor;
  worker::MemoryCheckpointStore mine;
  mine.Put(Snapshot(10, {"1.0"}, 4096));
  const auto taken = Snapshot(10, {"0.0"}, 3 * kMemoryPieceBytes + 100);
  {
    RingPeerCopier copier(&mine, "job-1", "host-a", predecessor.address());
    copier.Copied(10);
    absl::SleepFor(absl::Milliseconds(300));  // NOT_FOUND meanwhile: not yet taken
    predecessor.store.Put(taken);
    for (int i = 0; i < 100 && mine.Copies("job-1", 10).size() < 2; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  }
  const auto copies = mine.Copies("job-1", 10);
  ASSERT_EQ(copies.size(), 2u);
  EXPECT_TRUE(copies[0]->of_host.empty());  // its own first
  EXPECT_EQ(copies[1]->of_host, "host-a");
  EXPECT_EQ(copies[1]->data_position, 40);
  EXPECT_TRUE(SameBlocks(*copies[1], *taken));
}

// A restoring host names the blocks its partitions need: a holder missing one refuses at once
// (NOT_FOUND), and the next holder serves them from its own copy and its ring copy together.
TEST(MemoryCheckpointTransfer, ARestoreFetchesTheNamedBlocksFromTheHolderThatHasThemAll) {
  MemoryHolder partial, whole;
  partial.store.Put(Snapshot(20, {"0.0"}, 1000));
  whole.store.Put(Snapshot(20, {"1.0"}, 1000));
  whole.store.Put(Snapshot(20, {"0.0"}, 2 * kMemoryPieceBytes, "host-a"));
  v1::MemoryRestore restore;
  restore.set_step(20);
  for (auto [host, holder] : {std::pair{"host-p", &partial}, std::pair{"host-w", &whole}}) {
    v1::MemoryHolder* entry = restore.add_holders();
    entry->set_host(host);
    entry->set_address(holder->address());
  }
  auto fetched = FetchMemoryCheckpoint(restore, "job-1", "host-c", {{"w", "0.0"}, {"w", "1.0"}},
                                       absl::Seconds(10));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  EXPECT_EQ((*fetched)->step, 20);
  EXPECT_EQ((*fetched)->data_position, 80);
  ASSERT_EQ((*fetched)->blocks["w"].size(), 2u);
  EXPECT_EQ((*fetched)->blocks["w"]["0.0"].bytes,
            whole.store.Copies("job-1", 20)[1]->blocks.at("w").at("0.0").bytes);
  EXPECT_EQ((*fetched)->blocks["w"]["1.0"].bytes,
            whole.store.Get("job-1", 20)->blocks.at("w").at("1.0").bytes);

  // A block no holder has: every holder's answer is named.
  auto missing = FetchMemoryCheckpoint(restore, "job-1", "host-c", {{"w", "2.0"}},
                                       absl::Seconds(10));
  ASSERT_TRUE(absl::IsUnavailable(missing.status())) << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "host-p: this host holds no block 2.0"))
      << missing.status();
  EXPECT_TRUE(absl::StrContains(missing.status().message(), "host-w:")) << missing.status();
}

// A ring copy is not the holder's own: asked for its own copy of a step it holds only as a
// ring copy, a host says so rather than passing the peer's blocks off as its own.
TEST(MemoryCheckpointTransfer, AHostServesOnlyItsOwnCopyAsItsOwn) {
  MemoryHolder holder;
  holder.store.Put(Snapshot(30, {"0.0"}, 100, "host-a"));
  auto copy = FetchPeerCopy("host-b", holder.address(), "job-1", 30, absl::Seconds(10));
  ASSERT_TRUE(absl::IsNotFound(copy.status())) << copy.status();
  EXPECT_TRUE(absl::StrContains(copy.status().message(), "copy of its own")) << copy.status();
}

}  // namespace
}  // namespace meshrun::services
