#include "worker/memory_checkpoints.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"

namespace meshrun::worker {
namespace {

absl::StatusOr<checkpoint::Block> BlockOfPartition(const StateLayout& layout,
                                                   const v1::TensorSpec& spec,
                                                   int64_t partition) {
  return checkpoint::BlockOf({spec.shape().begin(), spec.shape().end()},
                             {spec.sharding().begin(), spec.sharding().end()}, layout.mesh_axes,
                             layout.mesh_shape, partition);
}

}  // namespace

int64_t MemorySnapshot::Bytes() const {
  int64_t bytes = 0;
  for (const auto& [name, keyed] : blocks) {
    for (const auto& [key, block] : keyed) bytes += static_cast<int64_t>(block.bytes.size());
  }
  return bytes;
}

void MemoryCheckpointStore::Put(std::shared_ptr<const MemorySnapshot> snapshot) {
  std::vector<std::shared_ptr<const MemorySnapshot>> dropped;  // freed outside the lock
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const MemorySnapshot>> kept;
  for (auto& held : snapshots_) {
    // A step at or past this one is of a run that ended (this one restored an older step).
    (held->job_id == snapshot->job_id && held->step < snapshot->step ? kept : dropped)
        .push_back(std::move(held));
  }
  std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) { return a->step > b->step; });
  while (kept.size() >= kKeptPerJob) {
    dropped.push_back(std::move(kept.back()));
    kept.pop_back();
  }
  kept.insert(kept.begin(), std::move(snapshot));
  snapshots_ = std::move(kept);
}

std::shared_ptr<const MemorySnapshot> MemoryCheckpointStore::Get(const std::string& job_id,
                                                                 int64_t step) const {
  absl::MutexLock lock(&mu_);
  for (const auto& held : snapshots_) {
    if (held->job_id == job_id && held->step == step) return held;
  }
  return nullptr;
}

std::vector<std::shared_ptr<const MemorySnapshot>> MemoryCheckpointStore::Held() const {
  absl::MutexLock lock(&mu_);
  return snapshots_;
}

void MemoryCheckpointStore::Drop(const std::string& job_id) {
  std::vector<std::shared_ptr<const MemorySnapshot>> dropped;
  absl::MutexLock lock(&mu_);
  std::erase_if(snapshots_, [&](auto& held) {
    if (held->job_id != job_id) return false;
    dropped.push_back(std::move(held));
    return true;
  });
}

int64_t MemoryCheckpointStore::Bytes() const {
  absl::MutexLock lock(&mu_);
  int64_t bytes = 0;
  for (const auto& held : snapshots_) bytes += held->Bytes();
  return bytes;
}

absl::StatusOr<std::shared_ptr<MemorySnapshot>> TakeSnapshot(
    runtime::Runtime& runtime, const StateLayout& layout, const std::string& job_id,
    int64_t step, int64_t data_position, const StepLoop::DeviceBuffers& state,
    const std::vector<int64_t>& partitions, Metrics* metrics) {
  auto snapshot = std::make_shared<MemorySnapshot>();
  snapshot->job_id = job_id;
  snapshot->step = step;
  snapshot->data_position = data_position;
  for (size_t i = 0; i < layout.state.size(); ++i) {
    const v1::TensorSpec& spec = layout.state[i];
    std::map<std::string, runtime::HostArray>& keyed = snapshot->blocks[spec.name()];
    for (size_t d = 0; d < partitions.size(); ++d) {
      ASSIGN_OR_RETURN(checkpoint::Block block, BlockOfPartition(layout, spec, partitions[d]));
      const std::string key = checkpoint::ChunkKey(block.start, block.size);
      if (keyed.contains(key)) continue;  // another local device holds the same block
      absl::StatusOr<runtime::HostArray> host = runtime.ToHost(*state[d][i]);
      if (!host.ok()) {
        return absl::Status(host.status().code(), absl::StrCat("copying ", spec.name(),
                                                               " to host memory: ",
                                                               host.status().message()));
      }
      if (metrics != nullptr) metrics->AddBytes(kTransferFromDeviceBytes, host->shape.ByteSize());
      keyed.emplace(key, *std::move(host));
    }
  }
  return snapshot;
}

absl::StatusOr<StepLoop::DeviceBuffers> RestoreSnapshot(runtime::Runtime& runtime,
                                                        const StateLayout& layout,
                                                        const MemorySnapshot& snapshot,
                                                        const std::vector<int>& device_indices,
                                                        const std::vector<int64_t>& partitions,
                                                        Metrics* metrics) {
  StepLoop::DeviceBuffers out(device_indices.size());
  for (const v1::TensorSpec& spec : layout.state) {
    ASSIGN_OR_RETURN(const runtime::DType dtype, runtime::ParseDType(spec.dtype()));
    auto array = snapshot.blocks.find(spec.name());
    for (size_t d = 0; d < device_indices.size(); ++d) {
      ASSIGN_OR_RETURN(checkpoint::Block block, BlockOfPartition(layout, spec, partitions[d]));
      const std::string key = checkpoint::ChunkKey(block.start, block.size);
      const runtime::HostArray* held = nullptr;
      if (array != snapshot.blocks.end()) {
        if (auto it = array->second.find(key); it != array->second.end()) held = &it->second;
      }
      if (held == nullptr || held->shape.dims != block.size ||
          held->shape.dtype != dtype) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the in-memory checkpoint of step ", snapshot.step, " holds no ", spec.dtype(), "[",
            absl::StrJoin(block.size, ","), "] block ", key, " of ", spec.name(),
            " (taken on another mesh)"));
      }
      ASSIGN_OR_RETURN(std::unique_ptr<runtime::DeviceBuffer> buffer,
                       runtime.ToDevice(*held, device_indices[d]));
      if (metrics != nullptr) metrics->AddBytes(kTransferToDeviceBytes, held->shape.ByteSize());
      out[d].push_back(std::move(buffer));
    }
  }
  return out;
}

}  // namespace meshrun::worker
