#include "coordinator_service/executable_transfer.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <string>

#include <grpcpp/generic/generic_stub.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/crc32c.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "rpc/server_support.h"

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
// serialized by protobuf, then `crc32c` (fixed32) and `data`'s key and length by hand, then the
// bytes from the cache file (protobuf accepts fields in any order, so this parses as the
// message); the CRC of the bytes is filled in once they are read. No staging buffer and no
// serialization copy of the payload.
absl::StatusOr<grpc::ByteBuffer> EncodeChunk(const v1::LoadExecutableChunk& fields,
                                             const coordinator::CachedExecutable& executable,
                                             uint64_t offset, size_t size) {
  std::string head = fields.SerializeAsString();
  AppendVarint(v1::LoadExecutableChunk::kCrc32CFieldNumber << 3 | 5, &head);  // fixed32
  const size_t crc_at = head.size();
  head.append(4, '\0');
  AppendVarint(v1::LoadExecutableChunk::kDataFieldNumber << 3 | 2, &head);  // length-delimited
  AppendVarint(size, &head);
  grpc::Slice slice(head.size() + size);  // uninitialized, ours alone until written
  char* out = reinterpret_cast<char*>(const_cast<uint8_t*>(slice.begin()));
  std::memcpy(out, head.data(), head.size());
  RETURN_IF_ERROR(executable.ReadAt(offset, absl::MakeSpan(out + head.size(), size)));
  const uint32_t crc = Crc32c(absl::string_view(out + head.size(), size));
  for (int i = 0; i < 4; ++i) out[crc_at + i] = static_cast<char>(crc >> (8 * i));  // little-endian
  return grpc::ByteBuffer(&slice, 1);
}

// The fields of the chunk at `offset` (`size` bytes), all but its data.
v1::LoadExecutableChunk ChunkFields(const coordinator::CachedExecutable& executable,
                                    uint64_t offset, size_t size) {
  v1::LoadExecutableChunk fields;
  if (offset == 0) {  // only the first chunk names them
    fields.set_fingerprint(executable.sha256());
    fields.set_total_bytes(static_cast<int64_t>(executable.size()));
  }
  fields.set_offset(static_cast<int64_t>(offset));
  if (offset + size == executable.size()) fields.set_sha256(executable.sha256());
  return fields;
}

// One call, driven from the caller's thread: it reads chunk k+1 from the cache file while
// chunk k is being written, with one write in flight, so gRPC's threads never wait for the
// disk. Lives on Send's frame, which returns only after OnDone.
class ChunkWriter final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  absl::Status Send(grpc::GenericStub& stub, grpc::ClientContext* context,
                    const coordinator::CachedExecutable& executable, size_t chunk_bytes) {
    stub.PrepareBidiStreamingCall(
        context, absl::StrCat("/", v1::Worker::service_full_name(), "/LoadExecutable"), {}, this);
    StartRead(&response_);
    AddHold();  // writes start outside reactions
    StartCall();
    absl::Status read;
    bool writable = true;
    for (uint64_t offset = 0; writable && offset < executable.size();) {
      const size_t n =
          static_cast<size_t>(std::min<uint64_t>(chunk_bytes, executable.size() - offset));
      absl::StatusOr<grpc::ByteBuffer> next =
          EncodeChunk(ChunkFields(executable, offset, n), executable, offset, n);
      if (!next.ok()) {  // the cache file is damaged: end the call, the worker keeps nothing
        read = next.status();
        context->TryCancel();
        break;
      }
      writable = WaitForWrite();
      if (writable) {
        Write(*std::move(next));
        offset += n;
      }
    }
    if (read.ok() && writable && WaitForWrite()) StartWritesDone();
    RemoveHold();
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    if (!read.ok()) return read;
    absl::Status finished = FromGrpcStatus(status_);
    if (!finished.ok()) return finished;  // the worker's reason beats our write error
    if (!write_ok_) return absl::UnavailableError("worker closed the stream");
    return absl::OkStatus();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    write_ok_ = ok;  // false: the stream broke; OnDone brings the worker's reason
  }
  void OnReadDone(bool) override {}
  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&mu_);
    status_ = status;
    done_ = true;
  }

 private:
  // Waits for the write in flight, if any; false if the stream broke.
  bool WaitForWrite() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(this, &ChunkWriter::NotWriting));
    return write_ok_;
  }
  bool NotWriting() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; }
  void Write(grpc::ByteBuffer chunk) {
    {
      absl::MutexLock lock(&mu_);
      writing_ = true;
    }
    in_flight_ = std::move(chunk);  // the previous write is done with it
    StartWrite(&in_flight_);
  }

  grpc::ByteBuffer in_flight_;
  grpc::ByteBuffer response_;
  absl::Mutex mu_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool write_ok_ ABSL_GUARDED_BY(mu_) = true;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::Status SendExecutable(const std::shared_ptr<grpc::Channel>& worker,
                            const coordinator::CachedExecutable& executable,
                            const TransferOptions& options) {
  constexpr size_t kMax = kMaxExecutableChunkBytes;
  if (options.chunk_bytes == 0 || options.chunk_bytes > kMax) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes=", options.chunk_bytes, " must be in [1, ", kMax, "]"));
  }
  auto context = ContextWithTimeout(
      options.base_timeout +
      absl::Seconds(static_cast<double>(executable.size()) / options.min_bytes_per_second));
  grpc::GenericStub stub(worker);
  ChunkWriter writer;
  return writer.Send(stub, context.get(), executable, options.chunk_bytes);
}

}  // namespace meshrun::services
