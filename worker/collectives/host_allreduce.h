// HostAllReduce: sums (or averages) f32 host buffers across the hosts of a data-parallel job,
// in place, over TCP with gloo's ring all-reduce. It is how multi-host CPU jobs share
// gradients between the `grad` and `apply` programs, since XLA's CPU plugin runs one process
// per program (docs/multihost_cpu.md).
//
// Create() is the rendezvous: every rank publishes itself under the job-scoped `prefix` in a
// key-value store (on a worker: the coordinator's, through runtime::KeyValueClient), waits
// for all the others, exchanges gloo's pair addresses through the same store, connects a full
// mesh of TCP pairs, passes a barrier, and deletes the keys it wrote. Every wait is bounded by
// `timeout`; a rank that does not show up is named in the error, nothing hangs.
//
// Results are the same bits on every rank and in every run for the same inputs: the ring
// reduces each segment along the same fixed rank order whatever the arrival order, and then
// copies the reduced segments around.
//
// Thread-safety: AllReduce calls are serialized by an internal mutex (gloo runs one collective
// at a time here). Lifetime: destroying it closes the connections; peers still in a collective
// with it then fail with UNAVAILABLE. After a failed collective the object is unusable (every
// later call fails with FAILED_PRECONDITION naming the first error): the job must fail or
// rendezvous again under a new prefix.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "runtime/kv_client.h"

namespace gloo {
class Context;
}  // namespace gloo

namespace meshrun::worker::collectives {

enum class ReduceOp { kSum, kMean };

class HostAllReduce {
 public:
  struct Config {
    int rank = 0;
    int size = 1;  // ranks (hosts) in the job; 1 means no peers and no network at all
    // The rendezvous store, shared by every rank. Required when size > 1.
    std::shared_ptr<runtime::KeyValueClient> store;
    // Job-scoped key prefix, unique per rendezvous (e.g. "collectives/<job id>/<attempt>"):
    // two rendezvous under one prefix at once would mix their peers.
    std::string prefix;
    // The address this rank listens on and advertises to its peers (an IP or host name).
    std::string bind_address = "127.0.0.1";
    // A network interface name (e.g. "eth0") to use instead of bind_address when set.
    std::string network_interface;
    // Bounds each rendezvous phase (arrival, address exchange and connect, barrier) and each
    // collective.
    absl::Duration timeout = absl::Seconds(60);
    // Optional: a name per rank (e.g. its host) used in error messages; empty or `size` names.
    std::vector<std::string> peer_names;
  };

  // Rendezvous with the other ranks; returns once all are connected.
  // Errors: INVALID_ARGUMENT (a bad Config field, named, with the fix; an address or
  // interface that cannot be bound), DEADLINE_EXCEEDED (ranks that did not arrive or connect
  // within timeout, each named), UNAVAILABLE (the store or a peer connection failed).
  static absl::StatusOr<std::unique_ptr<HostAllReduce>> Create(Config config);
  ~HostAllReduce();
  HostAllReduce(const HostAllReduce&) = delete;
  HostAllReduce& operator=(const HostAllReduce&) = delete;

  // Reduces every buffer elementwise across ranks, in place: afterwards buffer i holds the sum
  // (kMean: the sum divided by size) of all ranks' buffer i. Every rank must pass the same
  // number of buffers with the same lengths in the same order; buffers may be empty.
  // Errors: FAILED_PRECONDITION (ranks disagree on the buffer layout, or an earlier collective
  // failed), DEADLINE_EXCEEDED (a peer stalled past timeout), UNAVAILABLE (a peer closed its
  // connection). On error the buffers' contents are unspecified.
  absl::Status AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op);

  int rank() const { return config_.rank; }
  int size() const { return config_.size; }

 private:
  explicit HostAllReduce(Config config);
  absl::Status Rendezvous();
  // Both throw gloo's exceptions; AllReduce turns them into a status.
  void Collective(float* data, size_t count, ReduceOp op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckLayout(int64_t buffers, int64_t elements) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string PeerName(int rank) const;

  const Config config_;
  std::shared_ptr<gloo::Context> context_;
  absl::Mutex mu_;
  std::vector<float> staging_ ABSL_GUARDED_BY(mu_);  // packs several buffers into one ring pass
  absl::Status failed_ ABSL_GUARDED_BY(mu_);
  int64_t rounds_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace meshrun::worker::collectives
