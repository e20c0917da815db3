#include "cli/cli_upload.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/protocol.h"
#include "common/sha256.h"
#include "rpc/server_support.h"

namespace meshrun::services {

absl::Status UploadPrograms(v1::Coordinator::StubInterface& stub, v1::JobSpec& spec,
                            absl::Duration timeout) {
  v1::JobSpec uploaded = spec;
  for (v1::Program& program : *uploaded.mutable_programs()) {
    const std::string& bytes = program.stablehlo();
    if (bytes.empty()) continue;
    auto context = ContextWithTimeout(timeout);
    v1::UploadProgramResponse response;
    auto writer = stub.UploadProgram(context.get(), &response);
    v1::ProgramChunk chunk;
    chunk.set_sha256(Sha256Hex(bytes));
    chunk.set_total_bytes(static_cast<int64_t>(bytes.size()));
    for (size_t offset = 0; offset < bytes.size(); offset += kMaxProgramChunkBytes) {
      chunk.set_data(bytes.substr(offset, kMaxProgramChunkBytes));
      if (!writer->Write(chunk)) break;  // the server ended the call: Finish says why
      chunk.clear_sha256();
      chunk.clear_total_bytes();
    }
    writer->WritesDone();
    if (absl::Status s = FromGrpcStatus(writer->Finish()); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("uploading program ", program.role(), ": ",
                                                 s.message()));
    }
    program.clear_stablehlo();
    program.set_stablehlo_sha256(response.sha256());
  }
  spec = std::move(uploaded);
  return absl::OkStatus();
}

}  // namespace meshrun::services
