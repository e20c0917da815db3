#include "services/executable_transfer.h"

#include <memory>
#include <string>

#include "common/grpc_status.h"
#include "services/server_support.h"

namespace meshrun::services {

absl::Status SendExecutable(v1::Worker::Stub& worker, const coordinator::CachedExecutable& executable,
                            const TransferOptions& options) {
  auto context = ContextWithTimeout(
      options.base_timeout +
      absl::Seconds(static_cast<double>(executable.size()) / options.min_bytes_per_second));
  v1::LoadExecutableResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::LoadExecutableChunk>> writer =
      worker.LoadExecutable(context.get(), &response);
  uint64_t offset = 0;
  v1::LoadExecutableChunk chunk;
  absl::Status streamed =
      executable.ForEachChunk(options.chunk_bytes, [&](absl::string_view piece) -> absl::Status {
        chunk.Clear();
        if (offset == 0) {
          chunk.set_fingerprint(executable.sha256());
          chunk.set_total_bytes(static_cast<int64_t>(executable.size()));
        }
        chunk.set_offset(static_cast<int64_t>(offset));
        chunk.set_data(piece.data(), piece.size());
        offset += piece.size();
        if (offset == executable.size()) chunk.set_sha256(executable.sha256());
        if (!writer->Write(chunk)) return absl::UnavailableError("worker closed the stream");
        return absl::OkStatus();
      });
  writer->WritesDone();
  absl::Status finished = FromGrpcStatus(writer->Finish());
  if (!finished.ok()) return finished;  // the worker's reason beats our write error
  return streamed;
}

}  // namespace meshrun::services
