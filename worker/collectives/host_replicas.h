// Host replicas of a mode-B job (docs/multihost_cpu.md): several CPU hosts run the same mesh,
// each on its own rows of the global batch, and average their gradient accumulators between
// the `grad` and `apply` programs, so every host applies the same update.
//
// Thread-safety: the hook is called by one step loop thread only (StepLoop's contract); it is
// not safe to call concurrently. Lifetime: the hook owns its HostAllReduce (the TCP
// connections to the other hosts), which closes when the last copy of the hook is destroyed;
// `runtime` and `metrics` are borrowed and must outlive it.
#pragma once

#include "worker/collectives/host_allreduce.h"
#include "worker/metrics.h"
#include "runtime/runtime.h"
#include "worker/step_loop.h"

namespace meshrun::worker::collectives {

struct HostReplicasConfig {
  runtime::Runtime* runtime = nullptr;
  // Rank = this host's index among the replicas, size = their count, the rendezvous store and
  // a prefix unique to the job (e.g. "collectives/<job id>").
  HostAllReduce::Config allreduce;
  // Every local device holds the same accumulators (replicated parameters): one copy per host
  // crosses the network. Otherwise each device's are averaged with the same device's elsewhere.
  bool replicated_across_devices = true;
  Metrics* metrics = nullptr;  // optional: transfer and all-reduce time and bytes
};

// StepLoop's reduce_gradients hook: replaces the accumulators with their mean over the hosts.
// The rendezvous with the other hosts happens on the first call, on the loop thread, so
// starting the job on one host never waits for the others.
// Errors (of a call): the rendezvous's and the all-reduce's (HostAllReduce, AllReduceInPlace),
// naming the host that is missing or gone; after one, every later call fails too.
StepLoop::GradientHook AverageAcrossHosts(HostReplicasConfig config);

}  // namespace meshrun::worker::collectives
