#include "worker_service/memory_checkpoint_transfer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "rpc/server_support.h"

namespace meshrun::services {
namespace {

class MemoryServeReactor final : public grpc::ServerWriteReactor<v1::MemoryCheckpointPiece> {
 public:
  struct Entry {
    const std::string* name;
    const std::string* key;
    const runtime::HostArray* block;
  };
  // `blocks` point into `copies`, which the reactor keeps alive.
  MemoryServeReactor(std::vector<std::shared_ptr<const worker::MemorySnapshot>> copies,
                     std::vector<Entry> blocks)
      : copies_(std::move(copies)), blocks_(std::move(blocks)) {
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the fetcher went away"));
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  void WriteNext() {
    if (next_ >= blocks_.size()) return Finish(grpc::Status::OK);
    const Entry& entry = blocks_[next_];
    const std::string& bytes = entry.block->bytes;
    piece_.Clear();
    piece_.set_array(*entry.name);
    piece_.set_key(*entry.key);
    piece_.set_offset(offset_);
    piece_.set_data_position(copies_.front()->data_position);
    if (offset_ == 0) {
      piece_.set_dtype(std::string(runtime::DTypeName(entry.block->shape.dtype)));
      for (int64_t n : entry.block->shape.dims) piece_.add_dims(n);
    }
    const int64_t n = std::min<int64_t>(kMemoryPieceBytes,
                                        static_cast<int64_t>(bytes.size()) - offset_);
    piece_.set_data(bytes.substr(static_cast<size_t>(offset_), static_cast<size_t>(n)));
    offset_ += n;
    if (offset_ >= static_cast<int64_t>(bytes.size())) {
      ++next_;
      offset_ = 0;
    }
    StartWrite(&piece_);
  }

  std::vector<std::shared_ptr<const worker::MemorySnapshot>> copies_;
  std::vector<Entry> blocks_;
  size_t next_ = 0;
  int64_t offset_ = 0;
  v1::MemoryCheckpointPiece piece_;
};

class RefusedReactor final : public grpc::ServerWriteReactor<v1::MemoryCheckpointPiece> {
 public:
  explicit RefusedReactor(grpc::Status status) { Finish(status); }
  void OnDone() override { delete this; }
};

// Adds `piece` to `snapshot`. Errors: INVALID_ARGUMENT (out of order, a bad dtype or size).
absl::Status Accept(const v1::MemoryCheckpointPiece& piece, worker::MemorySnapshot& snapshot) {
  runtime::HostArray& block = snapshot.blocks[piece.array()][piece.key()];
  if (piece.offset() == 0) {
    ASSIGN_OR_RETURN(block.shape.dtype, runtime::ParseDType(piece.dtype()));
    block.shape.dims.assign(piece.dims().begin(), piece.dims().end());
    block.bytes.clear();
    block.bytes.reserve(static_cast<size_t>(block.shape.ByteSize()));
  }
  if (piece.offset() != static_cast<int64_t>(block.bytes.size()) ||
      static_cast<int64_t>(block.bytes.size() + piece.data().size()) > block.shape.ByteSize()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a piece of ", piece.array(), " block ", piece.key(), " at offset ", piece.offset(),
        " does not follow the ", block.bytes.size(), " bytes received of ",
        block.shape.ByteSize()));
  }
  block.bytes.append(piece.data());
  snapshot.data_position = piece.data_position();
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> FetchFrom(
    const std::string& host, const std::string& address,
    const v1::FetchMemoryCheckpointRequest& request, absl::Duration timeout) {
  auto stub = v1::Worker::NewStub(MakeWorkerChannel(address, host));
  const std::string& job_id = request.job_id();
  const int64_t step = request.step();
  auto context = ContextWithTimeout(timeout);
  auto reader = stub->FetchMemoryCheckpoint(context.get(), request);
  auto snapshot = std::make_shared<worker::MemorySnapshot>();
  snapshot->job_id = job_id;
  snapshot->step = step;
  v1::MemoryCheckpointPiece piece;
  absl::Status accepted = absl::OkStatus();
  while (reader->Read(&piece)) {
    if (accepted.ok()) accepted = Accept(piece, *snapshot);
    if (!accepted.ok()) context->TryCancel();
  }
  const grpc::Status status = reader->Finish();
  RETURN_IF_ERROR(accepted);
  RETURN_IF_ERROR(FromGrpcStatus(status));
  for (const auto& [name, keyed] : snapshot->blocks) {
    for (const auto& [key, block] : keyed) {
      if (static_cast<int64_t>(block.bytes.size()) != block.shape.ByteSize()) {
        return absl::DataLossError(absl::StrCat(name, " block ", key, " arrived truncated"));
      }
    }
  }
  return snapshot;
}

}  // namespace

grpc::ServerWriteReactor<v1::MemoryCheckpointPiece>* ServeMemoryCheckpoint(
    std::vector<std::shared_ptr<const worker::MemorySnapshot>> copies,
    const v1::FetchMemoryCheckpointRequest& request) {
  const auto not_found = [&](const std::string& what) {
    return new RefusedReactor(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("this host holds no ", what, " of the in-memory checkpoint of step ",
                     request.step(), " of job ", request.job_id())));
  };
  std::vector<MemoryServeReactor::Entry> blocks;
  if (request.blocks().empty()) {  // its own copy, whole
    if (copies.empty() || !copies.front()->of_host.empty()) return not_found("copy of its own");
    for (const auto& [name, keyed] : copies.front()->blocks) {
      for (const auto& [key, block] : keyed) blocks.push_back({&name, &key, &block});
    }
  } else {
    for (const v1::MemoryBlockRef& ref : request.blocks()) {
      const size_t before = blocks.size();
      for (const auto& copy : copies) {  // its own first, then a ring peer's
        auto array = copy->blocks.find(ref.array());
        if (array == copy->blocks.end()) continue;
        if (auto it = array->second.find(ref.key()); it != array->second.end()) {
          blocks.push_back({&array->first, &it->first, &it->second});
          break;
        }
      }
      if (blocks.size() == before) {
        return not_found(absl::StrCat("block ", ref.key(), " of ", ref.array()));
      }
    }
  }
  return new MemoryServeReactor(std::move(copies), std::move(blocks));
}

absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> FetchMemoryCheckpoint(
    const v1::MemoryRestore& restore, const std::string& job_id, const std::string& self,
    const std::vector<std::pair<std::string, std::string>>& blocks, absl::Duration timeout) {
  v1::FetchMemoryCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(restore.step());
  for (const auto& [array, key] : blocks) {
    v1::MemoryBlockRef* ref = request.add_blocks();
    ref->set_array(array);
    ref->set_key(key);
  }
  std::vector<std::string> errors;
  for (const v1::MemoryHolder& holder : restore.holders()) {
    if (holder.host() == self) continue;
    absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> fetched =
        FetchFrom(holder.host(), holder.address(), request, timeout);
    if (fetched.ok()) {
      spdlog::info("job {}: fetched the in-memory checkpoint of step {} from {} ({} bytes)",
                   job_id, restore.step(), holder.host(), (*fetched)->Bytes());
      return fetched;
    }
    errors.push_back(absl::StrCat(holder.host(), ": ", fetched.status().message()));
  }
  return absl::UnavailableError(absl::StrCat(
      "no host served the in-memory checkpoint of step ", restore.step(),
      errors.empty() ? " (no other host holds it)" : absl::StrCat(": ", absl::StrJoin(errors, "; "))));
}

absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> FetchPeerCopy(const std::string& peer,
                                                                     const std::string& address,
                                                                     const std::string& job_id,
                                                                     int64_t step,
                                                                     absl::Duration timeout) {
  v1::FetchMemoryCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
  ASSIGN_OR_RETURN(std::shared_ptr<worker::MemorySnapshot> copy,
                   FetchFrom(peer, address, request, timeout));
  copy->of_host = peer;
  return copy;
}

RingPeerCopier::RingPeerCopier(worker::MemoryCheckpointStore* store, std::string job_id,
                               std::string peer, std::string address)
    : store_(store),
      job_id_(std::move(job_id)),
      peer_(std::move(peer)),
      address_(std::move(address)),
      thread_([this] { Run(); }) {}

RingPeerCopier::~RingPeerCopier() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

void RingPeerCopier::Copied(int64_t step) {
  absl::MutexLock lock(&mu_);
  pending_ = std::max(pending_, step);
}

void RingPeerCopier::Run() {
  for (;;) {
    int64_t step = 0;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](RingPeerCopier* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stopping_ || self->pending_ > 0;
          },
          this));
      if (stopping_) return;
      step = std::exchange(pending_, 0);
    }
    CopyStep(step);
  }
}

void RingPeerCopier::CopyStep(int64_t step) {
  // The predecessor takes the same step at about the same time (the hosts run one program):
  // a NOT_FOUND means "not yet", for a while.
  constexpr int kAttempts = 40;
  constexpr absl::Duration kRetry = absl::Milliseconds(50);
  constexpr absl::Duration kTimeout = absl::Seconds(30);
  absl::Status last;
  for (int attempt = 0; attempt < kAttempts; ++attempt) {
    {
      absl::MutexLock lock(&mu_);
      if (stopping_ || pending_ > step) return;  // a newer step is due
    }
    absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> copy =
        FetchPeerCopy(peer_, address_, job_id_, step, kTimeout);
    if (copy.ok()) {
      store_->Put(*std::move(copy));
      return;
    }
    last = copy.status();
    if (!absl::IsNotFound(last)) break;
    absl::SleepFor(kRetry);
  }
  spdlog::warn("job {}: no copy of ring peer {}'s in-memory checkpoint of step {}: {}", job_id_,
               peer_, step, last.ToString());
}

}  // namespace meshrun::services
