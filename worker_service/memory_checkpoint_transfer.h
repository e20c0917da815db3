// Moving an in-memory checkpoint between workers (docs/checkpoints.md, "Memory tier"): a host
// that takes a lost host's place in a restarted job fetches the state blocks from a host of the
// ended run that holds them (Worker.FetchMemoryCheckpoint), instead of reading the older
// committed checkpoint from disk; a host of a program spanning hosts copies its ring
// predecessor's blocks after each in-memory checkpoint.
//
// Thread-safety: the reactor is gRPC's (one call); FetchMemoryCheckpoint may be called from any
// thread. Errors: as each function states.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "meshrun/v1/job.pb.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "worker/memory_checkpoints.h"

namespace meshrun::services {

// Largest piece of a block one message carries.
inline constexpr int64_t kMemoryPieceBytes = 1 << 20;

// Serves the step's blocks `request` names from `copies` (the store's Copies: its own first),
// or with none named every block of its own copy; NOT_FOUND naming the job, step and a missing
// block when it cannot serve them all. The reactor deletes itself when the call ends and keeps
// the copies alive until then.
grpc::ServerWriteReactor<v1::MemoryCheckpointPiece>* ServeMemoryCheckpoint(
    std::vector<std::shared_ptr<const worker::MemorySnapshot>> copies,
    const v1::FetchMemoryCheckpointRequest& request);

// Fetches the `blocks` of step `restore.step()` of `job_id` from the first of the restore's
// holders that serves them all (its worker channel checks the holder's identity), skipping
// `self`. Errors: UNAVAILABLE naming each holder tried and why (none held them, none
// answered).
absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> FetchMemoryCheckpoint(
    const v1::MemoryRestore& restore, const std::string& job_id, const std::string& self,
    const std::vector<std::pair<std::string, std::string>>& blocks, absl::Duration timeout);

// Fetches ring peer `peer`'s own copy of step `step` of `job_id` from `address` (identity
// checked), as a snapshot marked of_host = `peer`. Errors: the holder's (NOT_FOUND when it has
// not taken the step yet), DATA_LOSS (a truncated block), INVALID_ARGUMENT (a malformed piece).
absl::StatusOr<std::shared_ptr<worker::MemorySnapshot>> FetchPeerCopy(const std::string& peer,
                                                                     const std::string& address,
                                                                     const std::string& job_id,
                                                                     int64_t step,
                                                                     absl::Duration timeout);

// Keeps a copy of a ring predecessor's in-memory checkpoints in `store`: after each of this
// host's own (Copied(step)), a background thread fetches the predecessor's copy of the same
// step, retrying briefly while the predecessor has not taken it yet. Failures are logged: the
// copy is a second line of defence, never worth stopping the job. Only the newest step asked
// for is fetched. Thread-safety: Copied from any thread. Lifetime: the destructor stops and
// joins the thread (waiting for at most one fetch); `store` must outlive it.
class RingPeerCopier {
 public:
  RingPeerCopier(worker::MemoryCheckpointStore* store, std::string job_id, std::string peer,
                 std::string address);
  ~RingPeerCopier();
  RingPeerCopier(const RingPeerCopier&) = delete;
  RingPeerCopier& operator=(const RingPeerCopier&) = delete;

  void Copied(int64_t step);

 private:
  void Run();
  void CopyStep(int64_t step);

  worker::MemoryCheckpointStore* const store_;
  const std::string job_id_, peer_, address_;
  absl::Mutex mu_;
  int64_t pending_ ABSL_GUARDED_BY(mu_) = 0;  // 0: none
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace meshrun::services
