// The coordinator's UploadProgram stream: a program's StableHLO arriving in chunks, written to
// the program store as it comes (coordinator/program_store.h), so no request carries a whole
// program and the server's receive limit (--max_request_bytes) can stay small.
//
// Lifetime: the reactor deletes itself when gRPC is done with it; `store` must outlive the
// server. Thread-safety: gRPC calls a reactor's methods one at a time.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "coordinator/program_store.h"
#include "meshrun/v1/coordinator.pb.h"
#include "rpc/identity_slots.h"

namespace meshrun::services {

// The reactor of one UploadProgram call. `slot` is the caller's slow-call slot (limits); when
// refused, the call ends at once with that status. Each chunk is written from gRPC's callback
// thread: an append to the page cache, well under a millisecond per 1 MiB chunk.
grpc::ServerReadReactor<v1::ProgramChunk>* StartProgramUpload(
    coordinator::ProgramStore* store, v1::UploadProgramResponse* response,
    absl::StatusOr<IdentitySlots::Slot> slot);

}  // namespace meshrun::services
