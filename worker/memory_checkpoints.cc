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
  const bool own = snapshot->of_host.empty();
  std::vector<std::shared_ptr<const MemorySnapshot>> same_kind, other_kind;
  for (auto& held : snapshots_) {
    if (held->job_id != snapshot->job_id) {
      dropped.push_back(std::move(held));
    } else if (held->of_host.empty() != own) {
      other_kind.push_back(std::move(held));
    } else {
      // A step at or past this one is of a run that ended (this one restored an older step).
      (held->step < snapshot->step ? same_kind : dropped).push_back(std::move(held));
    }
  }
  std::sort(same_kind.begin(), same_kind.end(),
            [](const auto& a, const auto& b) { return a->step > b->step; });
  while (same_kind.size() >= kKeptPerJob) {
    dropped.push_back(std::move(same_kind.back()));
    same_kind.pop_back();
  }
  same_kind.insert(same_kind.begin(), std::move(snapshot));
  snapshots_ = std::move(same_kind);
  for (auto& held : other_kind) snapshots_.push_back(std::move(held));
  std::stable_sort(snapshots_.begin(), snapshots_.end(),
                   [](const auto& a, const auto& b) { return a->step > b->step; });
}

std::shared_ptr<const MemorySnapshot> MemoryCheckpointStore::Get(const std::string& job_id,
                                                                 int64_t step) const {
  absl::MutexLock lock(&mu_);
  for (const auto& held : snapshots_) {
    if (held->job_id == job_id && held->step == step && held->of_host.empty()) return held;
  }
  return nullptr;
}

std::vector<std::shared_ptr<const MemorySnapshot>> MemoryCheckpointStore::Copies(
    const std::string& job_id, int64_t step) const {
  absl::MutexLock lock(&mu_);
  std::vector<std::shared_ptr<const MemorySnapshot>> copies;
  for (const auto& held : snapshots_) {
    if (held->job_id == job_id && held->step == step) copies.push_back(held);
  }
  std::stable_partition(copies.begin(), copies.end(),
                        [](const auto& copy) { return copy->of_host.empty(); });
  return copies;
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

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> BlocksNeeded(
    const StateLayout& layout, const std::vector<int64_t>& partitions) {
  std::vector<std::pair<std::string, std::string>> needed;
  for (const v1::TensorSpec& spec : layout.state) {
    for (int64_t partition : partitions) {
      ASSIGN_OR_RETURN(checkpoint::Block block, BlockOfPartition(layout, spec, partition));
      std::pair<std::string, std::string> ref(spec.name(),
                                              checkpoint::ChunkKey(block.start, block.size));
      if (std::find(needed.begin(), needed.end(), ref) == needed.end()) needed.push_back(ref);
    }
  }
  return needed;
}

absl::StatusOr<StepLoop::DeviceBuffers> RestoreSnapshot(
    runtime::Runtime& runtime, const StateLayout& layout,
    const std::vector<std::shared_ptr<const MemorySnapshot>>& copies,
    const std::vector<int>& device_indices, const std::vector<int64_t>& partitions,
    Metrics* metrics) {
  StepLoop::DeviceBuffers out(device_indices.size());
  const int64_t step = copies.empty() ? 0 : copies.front()->step;
  for (const v1::TensorSpec& spec : layout.state) {
    ASSIGN_OR_RETURN(const runtime::DType dtype, runtime::ParseDType(spec.dtype()));
    for (size_t d = 0; d < device_indices.size(); ++d) {
      ASSIGN_OR_RETURN(checkpoint::Block block, BlockOfPartition(layout, spec, partitions[d]));
      const std::string key = checkpoint::ChunkKey(block.start, block.size);
      const runtime::HostArray* held = nullptr;
      for (const auto& copy : copies) {
        auto array = copy->blocks.find(spec.name());
        if (array == copy->blocks.end()) continue;
        if (auto it = array->second.find(key); it != array->second.end()) {
          held = &it->second;
          break;
        }
      }
      if (held == nullptr || held->shape.dims != block.size ||
          held->shape.dtype != dtype) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the in-memory checkpoint of step ", step, " held here has no ", spec.dtype(), "[",
            absl::StrJoin(block.size, ","), "] block ", key, " of ", spec.name(),
            held == nullptr ? "" : " (taken on another mesh)"));
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
