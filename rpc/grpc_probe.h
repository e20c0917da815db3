// Client side of two standard gRPC services every meshrun server carries: health checking
// (grpc.health.v1) and server reflection (grpc.reflection.v1alpha). Debian's gRPC ships
// their servers but not their client stubs, so the few fields needed are encoded here by
// hand from the documented wire format.
//
// Thread-safety: the functions are independent and safe to call concurrently.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace meshrun::services {

// "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN", for `service` ("" = the server).
// Errors: the call's status (e.g. UNAVAILABLE when nothing listens, DEADLINE_EXCEEDED),
// DATA_LOSS when the answer cannot be parsed.
absl::StatusOr<std::string> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                        const std::string& service, absl::Duration timeout);

// The fully qualified names of the services the server exposes, as reflection lists them.
// Errors: as CheckHealth.
absl::StatusOr<std::vector<std::string>> ListServicesByReflection(
    const std::shared_ptr<grpc::Channel>& channel, absl::Duration timeout);

}  // namespace meshrun::services
