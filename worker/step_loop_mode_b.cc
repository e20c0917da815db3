// StepLoop's compile mode B loop (grad micro-steps, then apply); see step_loop.h.
#include "worker/step_loop.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/step_loop_internal.h"

namespace meshrun::worker {

using runtime::ArrayShape;
using runtime::DeviceBuffer;
using runtime::HostArray;

absl::Status StepLoop::ZeroAccumulators() {
  const std::vector<ArrayShape>& shapes = config_.grad->output_shapes();
  grad_acc_.clear();
  grad_acc_.resize(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    for (int i = 0; i < config_.spec.num_grad_acc; ++i) {
      const HostArray zeros{shapes[i], std::string(shapes[i].ByteSize(), '\0')};
      const absl::Time start = config_.clock->Now();
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer,
                       config_.runtime->ToDevice(zeros, devices_[d]));
      metrics_->AddTime(kTransferToDeviceTime, config_.clock->Now() - start);
      metrics_->AddBytes(kTransferToDeviceBytes, shapes[i].ByteSize());
      grad_acc_[d].push_back(std::move(buffer));
    }
  }
  return absl::OkStatus();
}

absl::Status StepLoop::RunModeBSteps() {
  const RunSpec& spec = config_.spec;
  const int64_t micro = spec.grad_accumulation;
  const int64_t total = spec.steps * micro;  // micro-batches over the run
  const int num_state = spec.num_state;
  if (cancelled()) return absl::CancelledError("cancelled before init");
  const int64_t first = spec.first_step;
  // The first micro-batch uploads while init runs.
  if (first <= spec.steps) RequestBatch((first - 1) * micro + 1);
  if (absl::Status status = Initialize(); !status.ok()) return PrefixStatus(status, "init: ");
  if (absl::Status status = ZeroAccumulators(); !status.ok()) {
    return PrefixStatus(status, "init: zero accumulators: ");
  }
  for (int64_t s = first; s <= spec.steps; ++s) {
    const absl::Time start = config_.clock->Now();
    absl::Duration data_wait;
    for (int64_t m = 1; m <= micro; ++m) {
      if (cancelled()) {
        return absl::CancelledError(absl::StrCat("cancelled before step ", s, ", micro-step ", m));
      }
      const std::string where = absl::StrCat("step ", s, ", micro-step ", m);
      const int64_t index = (s - 1) * micro + m;
      const absl::Time waiting = config_.clock->Now();
      absl::StatusOr<DeviceBuffers> batch = TakeBatch(index);
      data_wait += config_.clock->Now() - waiting;
      if (!batch.ok()) {
        if (absl::IsCancelled(batch.status()) && cancelled()) return batch.status();
        return PrefixStatus(batch.status(), where + ": ");
      }
      if (index < total) RequestBatch(index + 1);
      std::vector<std::vector<DeviceBuffer*>> args(devices_.size());
      for (size_t d = 0; d < devices_.size(); ++d) {
        for (int i = 0; i < num_state; ++i) args[d].push_back(state_[d][i].get());
        for (const auto& buffer : grad_acc_[d]) args[d].push_back(buffer.get());
        for (const auto& buffer : (*batch)[d]) args[d].push_back(buffer.get());
      }
      const absl::Time launched = config_.clock->Now();
      absl::StatusOr<DeviceBuffers> outputs =
          config_.runtime->Execute(*config_.grad, args, {.donate_inputs = grad_donate_});
      if (!outputs.ok()) return PrefixStatus(outputs.status(), where + " (grad): ");
      metrics_->AddTime(kExecuteTime, config_.clock->Now() - launched);
      for (size_t d = 0; d < devices_.size(); ++d) {
        for (int i = 0; i < spec.num_grad_acc; ++i) grad_acc_[d][i] = std::move((*outputs)[d][i]);
      }
    }
    if (config_.reduce_gradients) {
      if (absl::Status status = config_.reduce_gradients(grad_acc_); !status.ok()) {
        // A replica lost mid-step: this host's state is step s-1's, whole (grad does not
        // donate it). Kept in memory, the restart resumes right after it.
        KeepStateInMemory(s - 1);
        return PrefixStatus(status, absl::StrCat("step ", s, ": gradient reduction: "));
      }
    }
    std::vector<std::vector<DeviceBuffer*>> args(devices_.size());
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (int i = 0; i < num_state; ++i) args[d].push_back(state_[d][i].get());
      for (const auto& buffer : grad_acc_[d]) args[d].push_back(buffer.get());
    }
    const absl::Time launched = config_.clock->Now();
    absl::StatusOr<DeviceBuffers> outputs =
        config_.runtime->Execute(*config_.apply, args, {.donate_inputs = donate_});
    if (!outputs.ok()) return PrefixStatus(outputs.status(), absl::StrCat("step ", s, " (apply): "));
    RETURN_IF_ERROR(StepDone(s, start, launched, data_wait, *outputs));
    for (size_t d = 0; d < devices_.size(); ++d) {
      for (int i = 0; i < num_state; ++i) state_[d][i] = std::move((*outputs)[d][i]);
      for (int i = 0; i < spec.num_grad_acc; ++i) {
        grad_acc_[d][i] = std::move((*outputs)[d][num_state + i]);
      }
    }
    {
      absl::MutexLock l(&mu_);
      last_completed_ = s;
    }
    FinishStep(s, DecideAfterStep(s));
  }
  return absl::OkStatus();
}

}  // namespace meshrun::worker
