// absl::Status <-> grpc::Status, in RPC adapters only (rpc/, *_service/); logic code never sees
// gRPC types. Codes map one to one (both follow google.rpc.Code); messages are kept.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace meshrun {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// True for a refusal worth retrying with backoff: the server unreachable, too slow, or busy
// (RESOURCE_EXHAUSTED: its share of calls full). Reports a server waits for retry on these.
bool RetryLater(const grpc::Status& status);

}  // namespace meshrun
