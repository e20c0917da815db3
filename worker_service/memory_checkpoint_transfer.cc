#include "worker_service/memory_checkpoint_transfer.h"

#include <spdlog/spdlog.h>

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
  explicit MemoryServeReactor(std::shared_ptr<const worker::MemorySnapshot> snapshot)
      : snapshot_(std::move(snapshot)) {
    for (const auto& [name, keyed] : snapshot_->blocks) {
      for (const auto& [key, block] : keyed) blocks_.push_back({&name, &key, &block});
    }
    WriteNext();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the fetcher went away"));
    WriteNext();
  }
  void OnDone() override { delete this; }

 private:
  struct Entry {
    const std::string* name;
    const std::string* key;
    const runtime::HostArray* block;
  };
  void WriteNext() {
    if (next_ >= blocks_.size()) return Finish(grpc::Status::OK);
    const Entry& entry = blocks_[next_];
    const std::string& bytes = entry.block->bytes;
    piece_.Clear();
    piece_.set_array(*entry.name);
    piece_.set_key(*entry.key);
    piece_.set_offset(offset_);
    piece_.set_data_position(snapshot_->data_position);
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

  std::shared_ptr<const worker::MemorySnapshot> snapshot_;
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
    const v1::MemoryHolder& holder, const std::string& job_id, int64_t step,
    absl::Duration timeout) {
  auto stub = v1::Worker::NewStub(MakeWorkerChannel(holder.address(), holder.host()));
  v1::FetchMemoryCheckpointRequest request;
  request.set_job_id(job_id);
  request.set_step(step);
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
    std::shared_ptr<const worker::MemorySnapshot> snapshot,
    const v1::FetchMemoryCheckpointRequest& request) {
  if (snapshot == nullptr) {
    return new RefusedReactor(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("this host holds no in-memory checkpoint of step ", request.step(),
                     " of job ", request.job_id())));
  }
  return new MemoryServeReactor(std::move(snapshot));
}

absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> FetchMemoryCheckpoint(
    const v1::MemoryRestore& restore, const std::string& job_id, const std::string& self,
    absl::Duration timeout) {
  std::vector<std::string> errors;
  for (const v1::MemoryHolder& holder : restore.holders()) {
    if (holder.host() == self) continue;
    absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> fetched =
        FetchFrom(holder, job_id, restore.step(), timeout);
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

}  // namespace meshrun::services
