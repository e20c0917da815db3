#include "services/executable_transfer.h"

#include <memory>
#include <string>

#include "common/grpc_status.h"
#include "services/server_support.h"

namespace meshrun::services {

absl::Status SendExecutable(v1::Worker::Stub& worker, const coordinator::CachedExecutable& executable,
                            const TransferOptions& options) {
  if (options.chunk_bytes == 0) return absl::InvalidArgumentError("chunk_bytes must be positive");
  auto context = ContextWithTimeout(
      options.base_timeout +
      absl::Seconds(static_cast<double>(executable.size()) / options.min_bytes_per_second));
  v1::LoadExecutableResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::LoadExecutableChunk>> writer =
      worker.LoadExecutable(context.get(), &response);
  // Each piece is read straight into the message's reused 1 MiB string: no staging buffer and
  // no copy beyond gRPC's own serialization, as a plain stream of bytes in memory would do.
  v1::LoadExecutableChunk chunk;
  chunk.set_fingerprint(executable.sha256());
  chunk.set_total_bytes(static_cast<int64_t>(executable.size()));
  absl::Status streamed;
  for (uint64_t offset = 0; offset < executable.size();) {
    streamed = executable.ReadAt(offset, options.chunk_bytes, chunk.mutable_data());
    if (!streamed.ok()) break;
    chunk.set_offset(static_cast<int64_t>(offset));
    offset += chunk.data().size();
    if (offset == executable.size()) chunk.set_sha256(executable.sha256());
    if (!writer->Write(chunk)) {
      streamed = absl::UnavailableError("worker closed the stream");
      break;
    }
    chunk.clear_fingerprint();  // only the first chunk names them
    chunk.clear_total_bytes();
  }
  writer->WritesDone();
  absl::Status finished = FromGrpcStatus(writer->Finish());
  if (!finished.ok()) return finished;  // the worker's reason beats our write error
  return streamed;
}

}  // namespace meshrun::services
