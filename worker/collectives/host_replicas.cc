#include "worker/collectives/host_replicas.h"

#include <memory>
#include <utility>

#include "common/status_macros.h"
#include "worker/collectives/device_allreduce.h"

namespace meshrun::worker::collectives {

StepLoop::GradientHook AverageAcrossHosts(HostReplicasConfig config) {
  struct State {
    HostReplicasConfig config;
    std::unique_ptr<HostAllReduce> allreduce;  // after the first call's rendezvous
    absl::Status failed;                       // the rendezvous's error, kept
  };
  auto state = std::make_shared<State>(State{.config = std::move(config)});
  return [state](StepLoop::DeviceBuffers& grad_acc) -> absl::Status {
    if (state->allreduce == nullptr) {
      RETURN_IF_ERROR(state->failed);
      absl::StatusOr<std::unique_ptr<HostAllReduce>> created =
          HostAllReduce::Create(state->config.allreduce);
      if (!created.ok()) {
        state->failed = created.status();
        return state->failed;
      }
      state->allreduce = *std::move(created);
    }
    return AllReduceInPlace(
        *state->config.runtime, *state->allreduce, grad_acc,
        {.op = ReduceOp::kMean,
         .replicated_across_devices = state->config.replicated_across_devices,
         .metrics = state->config.metrics});
  };
}

}  // namespace meshrun::worker::collectives
