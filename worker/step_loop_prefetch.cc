// StepLoop's prefetch thread: takes each batch from the BatchSource, shards it and uploads it
// while the previous step runs; see step_loop.h.
#include "worker/step_loop.h"

#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "runtime/shard.h"
#include "worker/step_loop_internal.h"

namespace meshrun::worker {

using runtime::ArrayShape;
using runtime::DeviceBuffer;
using runtime::DType;
using runtime::HostArray;

bool StepLoop::BatchReadyOrCancelled() const { return prefetch_ready_step_ != 0 || cancel_; }

bool StepLoop::PrefetchWork() const { return prefetch_request_ != 0 || prefetch_shutdown_; }

void StepLoop::PrefetchMain() {
  while (true) {
    int64_t step;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(this, &StepLoop::PrefetchWork));
      if (prefetch_shutdown_) return;
      step = prefetch_request_;
      prefetch_request_ = 0;
    }
    absl::StatusOr<DeviceBuffers> batch = FetchBatch();
    absl::MutexLock l(&mu_);
    prefetched_ = std::move(batch);
    prefetch_ready_step_ = step;
  }
}

void StepLoop::RequestBatch(int64_t step) {
  absl::MutexLock l(&mu_);
  prefetch_request_ = step;
}

absl::StatusOr<StepLoop::DeviceBuffers> StepLoop::TakeBatch(int64_t step) {
  absl::MutexLock l(&mu_);
  mu_.Await(absl::Condition(this, &StepLoop::BatchReadyOrCancelled));
  if (cancel_) return absl::CancelledError(absl::StrCat("cancelled before step ", step));
  if (prefetch_ready_step_ != step) {
    return absl::InternalError(absl::StrCat("prefetched batch ", prefetch_ready_step_,
                                            ", expected ", step));
  }
  absl::StatusOr<DeviceBuffers> batch = std::move(*prefetched_);
  prefetched_.reset();
  prefetch_ready_step_ = 0;
  return batch;
}

absl::StatusOr<StepLoop::DeviceBuffers> StepLoop::FetchBatch() {
  const RunSpec& spec = config_.spec;
  ASSIGN_OR_RETURN(std::vector<HostArray> arrays, config_.batches->Next());
  if (arrays.size() != spec.batch_sharding.size()) {
    return absl::InvalidArgumentError(absl::StrCat("the batch has ", arrays.size(),
                                                   " arrays, the step takes ",
                                                   spec.batch_sharding.size(), " batch inputs"));
  }
  const std::optional<runtime::ProgramSignature>& signature = batch_program_->signature();
  auto input_name = [&](size_t a) {
    return signature.has_value() ? signature->inputs[batch_offset_ + a].name
                                 : absl::StrCat("batch input ", a);
  };
  for (size_t a = 0; a < arrays.size(); ++a) {
    const HostArray& array = arrays[a];
    if (array.shape.dtype == DType::kInvalid ||
        static_cast<int64_t>(array.bytes.size()) != array.shape.ByteSize()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch array '", input_name(a), "' is ", runtime::ToString(array.shape), " with ",
          array.bytes.size(), " bytes"));
    }
  }
  DeviceBuffers out(devices_.size());
  for (size_t d = 0; d < devices_.size(); ++d) {
    for (size_t a = 0; a < arrays.size(); ++a) {
      absl::StatusOr<HostArray> shard =
          runtime::ShardOf(arrays[a], spec.batch_sharding[a], spec.mesh_axes, spec.mesh_shape,
                           static_cast<int>(partitions_[d]));
      if (!shard.ok()) {
        return PrefixStatus(shard.status(), absl::StrCat("batch array '", input_name(a), "': "));
      }
      if (signature.has_value()) {
        const ArrayShape& expected = signature->inputs[batch_offset_ + a].shape;
        if (shard->shape != expected) {
          return absl::InvalidArgumentError(absl::StrCat(
              "batch array '", input_name(a), "' is ", runtime::ToString(arrays[a].shape),
              ", whose shards are ", runtime::ToString(shard->shape), "; the ",
              config_.grad != nullptr ? "grad program" : "step", " takes ",
              runtime::ToString(expected), " per device"));
        }
      }
      const absl::Time start = config_.clock->Now();
      ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer,
                       config_.runtime->ToDevice(*shard, devices_[d]));
      metrics_->AddTime(kTransferToDeviceTime, config_.clock->Now() - start);
      metrics_->AddBytes(kTransferToDeviceBytes, shard->shape.ByteSize());
      out[d].push_back(std::move(buffer));
    }
  }
  return out;
}

}  // namespace meshrun::worker
