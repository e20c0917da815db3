// The protocol versions this build speaks, and the handshake check both services use.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace meshrun {

inline constexpr uint32_t kProtocolMinVersion = 1;
inline constexpr uint32_t kProtocolMaxVersion = 1;
// The version clients of this build send.
inline constexpr uint32_t kProtocolVersion = kProtocolMaxVersion;

// The largest executable chunk a worker accepts; the coordinator sends chunks of this size.
inline constexpr int64_t kMaxExecutableChunkBytes = 1 << 20;
// The largest UploadProgram chunk the coordinator accepts; clients send chunks of this size.
inline constexpr int64_t kMaxProgramChunkBytes = 1 << 20;

// The phase a worker reports in its heartbeats while its step loop waits in the cross-host
// gradient average (the coordinator's hang detection names it).
inline constexpr char kPhaseGradientAllReduce[] = "the gradient all-reduce";

// Errors: FAILED_PRECONDITION naming the peer's version and the supported range.
absl::Status CheckProtocolVersion(uint32_t peer_version);

}  // namespace meshrun
