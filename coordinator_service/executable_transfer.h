// The coordinator's side of an executable transfer: streams a cached executable to a worker's
// LoadExecutable in chunks of at most 1 MiB, the first naming the fingerprint (its sha256) and
// size, the last carrying the sha256 the worker verifies (on receive or on load: bench/README.md,
// "Integrity of executable transfers"), every one its CRC-32C. Each chunk is read from the cache
// file straight into the buffer gRPC sends.
//
// Thread-safety: SendExecutable may run concurrently, to the same or different workers.
#pragma once

#include <cstddef>
#include <memory>

#include <grpcpp/channel.h>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "coordinator/executable_cache.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "common/protocol.h"

namespace meshrun::services {

struct TransferOptions {
  size_t chunk_bytes = kMaxExecutableChunkBytes;  // the worker's limit
  // Deadline = base_timeout + size / min_bytes_per_second, so multi-GiB artifacts get the
  // time they need on a slow link and a stalled one still ends.
  absl::Duration base_timeout = absl::Seconds(60);
  double min_bytes_per_second = 50e6;
};

// Errors: the worker's (INVALID_ARGUMENT bad chunk, DATA_LOSS truncated or corrupt: nothing
// kept, ALREADY_EXISTS it holds the executable); UNAVAILABLE / DEADLINE_EXCEEDED; the cache's
// read errors (DATA_LOSS: the entry's file is damaged); INVALID_ARGUMENT chunk_bytes 0 or
// above the worker's limit.
absl::Status SendExecutable(const std::shared_ptr<grpc::Channel>& worker,
                            const coordinator::CachedExecutable& executable,
                            const TransferOptions& options = {});

}  // namespace meshrun::services
