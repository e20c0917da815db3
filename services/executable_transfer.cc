#include "services/executable_transfer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "services/server_support.h"

namespace meshrun::services {
namespace {

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// One LoadExecutableChunk read straight into the buffer gRPC sends: the small fields
// serialized by protobuf, then `data`'s key and length by hand, then the bytes from the cache
// file (protobuf accepts fields in any order, so this parses as the message). No staging
// buffer and no serialization copy of the payload.
absl::StatusOr<grpc::ByteBuffer> EncodeChunk(const v1::LoadExecutableChunk& fields,
                                             const coordinator::CachedExecutable& executable,
                                             uint64_t offset, size_t size) {
  std::string head = fields.SerializeAsString();
  AppendVarint(v1::LoadExecutableChunk::kDataFieldNumber << 3 | 2, &head);  // length-delimited
  AppendVarint(size, &head);
  grpc::Slice slice(head.size() + size);  // uninitialized, ours alone until written
  char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
  std::memcpy(out, head.data(), head.size());
  RETURN_IF_ERROR(executable.ReadAt(offset, absl::MakeSpan(out + head.size(), size)));
  return grpc::ByteBuffer(&slice, 1);
}

// Streams the chunks with one write in flight, then half-closes and waits for the worker's
// answer. Owned by SendExecutable's frame, which waits for OnDone.
class ChunkWriter final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  ChunkWriter(const coordinator::CachedExecutable& executable, size_t chunk_bytes)
      : executable_(executable), chunk_bytes_(chunk_bytes) {}

  void Start(grpc::GenericStub& stub, grpc::ClientContext* context) {
    context_ = context;
    stub.PrepareBidiStreamingCall(
        context, absl::StrCat("/", v1::Worker::service_full_name(), "/LoadExecutable"), {}, this);
    StartRead(&response_);
    WriteNext();
    StartCall();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {  // the stream broke; OnDone brings the worker's reason
      write_failed_ = true;
      return;
    }
    WriteNext();
  }
  void OnReadDone(bool) override {}
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

  absl::Status Wait() {
    done_.WaitForNotification();
    if (!read_error_.ok()) return read_error_;
    absl::Status finished = FromGrpcStatus(status_);
    if (!finished.ok()) return finished;  // the worker's reason beats our write error
    if (write_failed_) return absl::UnavailableError("worker closed the stream");
    return absl::OkStatus();
  }

 private:
  void WriteNext() {
    if (offset_ == executable_.size()) return StartWritesDone();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(chunk_bytes_, executable_.size() - offset_));
    v1::LoadExecutableChunk fields;
    if (offset_ == 0) {  // only the first chunk names them
      fields.set_fingerprint(executable_.sha256());
      fields.set_total_bytes(static_cast<int64_t>(executable_.size()));
    }
    fields.set_offset(static_cast<int64_t>(offset_));
    if (offset_ + n == executable_.size()) fields.set_sha256(executable_.sha256());
    absl::StatusOr<grpc::ByteBuffer> chunk = EncodeChunk(fields, executable_, offset_, n);
    if (!chunk.ok()) {  // the cache file is damaged: end the call, nothing is kept
      read_error_ = chunk.status();
      return context_->TryCancel();
    }
    buffer_ = *std::move(chunk);
    offset_ += n;
    StartWrite(&buffer_);
  }

  const coordinator::CachedExecutable& executable_;
  const size_t chunk_bytes_;
  uint64_t offset_ = 0;
  grpc::ByteBuffer buffer_;
  grpc::ByteBuffer response_;
  grpc::ClientContext* context_ = nullptr;
  bool write_failed_ = false;
  absl::Status read_error_;
  grpc::Status status_;
  absl::Notification done_;
};

}  // namespace

absl::Status SendExecutable(const std::shared_ptr<grpc::Channel>& worker,
                            const coordinator::CachedExecutable& executable,
                            const TransferOptions& options) {
  if (options.chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes must be positive");
  auto context = ContextWithTimeout(
      options.base_timeout +
      absl::Seconds(static_cast<double>(executable.size()) / options.min_bytes_per_second));
  grpc::GenericStub stub(worker);
  ChunkWriter writer(executable, options.chunk_bytes);
  writer.Start(stub, context.get());
  return writer.Wait();
}

}  // namespace meshrun::services
