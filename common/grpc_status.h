// absl::Status <-> grpc::Status, in RPC adapters only (rpc/, *_service/); logic code never sees
// gRPC types. Codes map one to one (both follow google.rpc.Code); messages are kept.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace meshrun {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace meshrun
