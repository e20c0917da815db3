// Conversions between wire messages and the runtime's plain types, shared by both services and
// the CLI. Pure; thread-safe.
#pragma once

#include "absl/status/statusor.h"
#include "meshrun/v1/coordinator.pb.h"
#include "runtime/identity.h"
#include "runtime/types.h"

namespace meshrun::services {

v1::RuntimeIdentity ToProto(const runtime::RuntimeIdentity& identity);
runtime::RuntimeIdentity FromProto(const v1::RuntimeIdentity& identity);

v1::DeviceInfo ToProto(const runtime::DeviceDescription& device);
runtime::DeviceDescription FromProto(const v1::DeviceInfo& device);

// The per-device signature a program declares (its tensors' shard shapes).
// Errors: INVALID_ARGUMENT naming a tensor with an unknown dtype.
absl::StatusOr<runtime::ProgramSignature> SignatureOf(const v1::Program& program);

}  // namespace meshrun::services
