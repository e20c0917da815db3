#include "worker/checkpointing.h"

#include <spdlog/spdlog.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"

namespace meshrun::worker {
namespace {

std::vector<std::string> ShardingOf(const v1::TensorSpec& spec) {
  return {spec.sharding().begin(), spec.sharding().end()};
}
std::vector<int64_t> ShapeOf(const v1::TensorSpec& spec) {
  return {spec.shape().begin(), spec.shape().end()};
}

}  // namespace

absl::StatusOr<std::unique_ptr<CheckpointSaver>> CheckpointSaver::Create(Config config) {
  if (config.runtime == nullptr || config.directory.empty() || !config.report) {
    return absl::InvalidArgumentError("a checkpoint saver needs a runtime, directory and report");
  }
  for (const v1::TensorSpec& spec : config.state) {
    ASSIGN_OR_RETURN(runtime::DType dtype, runtime::ParseDType(spec.dtype()));
    RETURN_IF_ERROR(checkpoint::ZarrDType(dtype).status());
  }
  auto saver = std::unique_ptr<CheckpointSaver>(new CheckpointSaver(std::move(config)));
  saver->writer_ = std::thread([s = saver.get()] { s->WriterMain(); });
  return saver;
}

CheckpointSaver::~CheckpointSaver() {
  Flush();
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  writer_.join();
}

StepLoop::CheckpointHook CheckpointSaver::Hook() {
  return [this](int64_t step, const StepLoop::DeviceBuffers& state,
                const std::vector<int64_t>& partitions, int64_t data_position) {
    Save(step, state, partitions, data_position);
  };
}

void CheckpointSaver::Flush() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &CheckpointSaver::Idle));
}

void CheckpointSaver::Save(int64_t step, const StepLoop::DeviceBuffers& state,
                           const std::vector<int64_t>& partitions, int64_t data_position) {
  const absl::Time start = absl::Now();
  Flush();  // one checkpoint in flight: the previous one is written before this one is copied
  Pending pending{.step = step, .data_position = data_position};
  absl::Status status = absl::OkStatus();
  int64_t mesh_size = 1;
  for (int64_t n : config_.mesh_shape) mesh_size *= n;
  for (size_t i = 0; i < config_.state.size() && status.ok() && config_.writes; ++i) {
    const v1::TensorSpec& spec = config_.state[i];
    const std::vector<int64_t> dims = ShapeOf(spec);
    const std::vector<std::string> sharding = ShardingOf(spec);
    checkpoint::ArrayChunks entry;
    entry.array.set_name(spec.name());
    entry.array.set_leaf(checkpoint::LeafOf(spec.name()));
    entry.array.set_dtype(spec.dtype());
    for (int64_t n : dims) entry.array.add_shape(n);
    // The lowest partition holding each chunk writes it.
    std::map<std::string, int64_t> owner;
    for (int64_t p = 0; p < mesh_size && status.ok(); ++p) {
      absl::StatusOr<checkpoint::Block> block =
          checkpoint::BlockOf(dims, sharding, config_.mesh_axes, config_.mesh_shape, p);
      if (!block.ok()) {
        status = block.status();
        break;
      }
      if (p == 0) {
        for (int64_t n : block->size) entry.array.add_chunk_shape(n);
      }
      owner.emplace(checkpoint::ChunkKey(block->start, block->size), p);
    }
    for (size_t d = 0; d < partitions.size() && status.ok(); ++d) {
      absl::StatusOr<checkpoint::Block> block = checkpoint::BlockOf(
          dims, sharding, config_.mesh_axes, config_.mesh_shape, partitions[d]);
      const std::string key = checkpoint::ChunkKey(block->start, block->size);
      if (owner[key] != partitions[d]) continue;
      absl::StatusOr<runtime::HostArray> host = config_.runtime->ToHost(*state[d][i]);
      if (!host.ok()) {
        status = absl::Status(host.status().code(), absl::StrCat("copying ", spec.name(),
                                                                 " to host: ",
                                                                 host.status().message()));
        break;
      }
      if (config_.metrics != nullptr) {
        config_.metrics->AddBytes(kTransferFromDeviceBytes, host->shape.ByteSize());
      }
      entry.chunks.push_back({key, *std::move(host)});
    }
    pending.arrays.push_back(std::move(entry));
  }
  pending.blocking_seconds = absl::ToDoubleSeconds(absl::Now() - start);
  // A failed copy is reported from the writer thread like every outcome, so reports keep
  // their order.
  if (!status.ok()) pending.arrays.clear();
  pending.copy_error = status;
  absl::MutexLock lock(&mu_);
  pending_ = std::move(pending);
}

void CheckpointSaver::WriterMain() {
  while (true) {
    Pending pending;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &CheckpointSaver::HasWork));
      if (!pending_.has_value()) return;  // stopping with nothing to write
      pending = *std::move(pending_);
      pending_.reset();
      writing_ = true;
    }
    v1::ReportCheckpointRequest report;
    report.set_job_id(config_.job_id);
    report.set_host(config_.host);
    report.set_incarnation(config_.incarnation);
    report.set_step(pending.step);
    report.set_blocking_seconds(pending.blocking_seconds);
    absl::Status status = pending.copy_error;
    if (status.ok()) {
      report.set_data_position(pending.data_position);
      const absl::Time start = absl::Now();
      absl::StatusOr<std::vector<v1::CheckpointArray>> written = checkpoint::WriteChunks(
          checkpoint::TempStepDir(config_.directory, pending.step), pending.arrays);
      status = written.status();
      if (written.ok()) {
        int64_t bytes = 0;
        for (v1::CheckpointArray& array : *written) {
          for (const auto& chunk : array.chunks()) bytes += chunk.bytes();
          *report.add_arrays() = std::move(array);
        }
        if (config_.metrics != nullptr) {
          config_.metrics->AddTime(kCheckpointWriteTime, absl::Now() - start);
          config_.metrics->AddBytes(kCheckpointBytes, bytes);
        }
        spdlog::info("job {}: checkpoint of step {} written ({} bytes from this host)",
                     config_.job_id, pending.step, bytes);
      }
    }
    if (!status.ok()) {
      report.set_error(absl::StrCat(config_.host, ": ", status.message()));
      if (config_.metrics != nullptr) config_.metrics->Increment(kCheckpointFailures);
      spdlog::error("job {}: checkpoint of step {}: {}", config_.job_id, pending.step,
                    status.ToString());
    }
    config_.report(std::move(report));
    absl::MutexLock lock(&mu_);
    writing_ = false;
  }
}

absl::StatusOr<StepLoop::DeviceBuffers> RestoreState(
    runtime::Runtime& runtime, const std::string& step_dir,
    const std::vector<v1::TensorSpec>& state, const std::vector<std::string>& mesh_axes,
    const std::vector<int64_t>& mesh_shape, const std::vector<int>& device_indices,
    const std::vector<int64_t>& partitions, Metrics* metrics) {
  ASSIGN_OR_RETURN(v1::CheckpointManifest manifest, checkpoint::ReadManifest(step_dir));
  StepLoop::DeviceBuffers out(device_indices.size());
  for (const v1::TensorSpec& spec : state) {
    const v1::CheckpointArray* array = nullptr;
    for (const v1::CheckpointArray& a : manifest.arrays()) {
      if (a.name() == spec.name()) array = &a;
    }
    if (array == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("the checkpoint ", step_dir, " has no array ", spec.name()));
    }
    ASSIGN_OR_RETURN(runtime::HostArray global, checkpoint::ReadArray(step_dir, *array));
    if (array->dtype() != spec.dtype() ||
        global.shape.dims != std::vector<int64_t>(spec.shape().begin(), spec.shape().end())) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the checkpoint's ", spec.name(), " is ", runtime::ToString(global.shape),
          ", the job's state input is ", spec.dtype(), "[", absl::StrJoin(spec.shape(), ","),
          "]"));
    }
    const int64_t element = runtime::DTypeByteSize(global.shape.dtype);
    for (size_t d = 0; d < device_indices.size(); ++d) {
      ASSIGN_OR_RETURN(checkpoint::Block block,
                       checkpoint::BlockOf(global.shape.dims, ShardingOf(spec), mesh_axes,
                                           mesh_shape, partitions[d]));
      runtime::HostArray shard{{global.shape.dtype, block.size}, {}};
      shard.bytes.assign(static_cast<size_t>(shard.shape.ByteSize()), '\0');
      checkpoint::CopyBlock(global.bytes.data(), global.shape.dims, block.start,
                            shard.bytes.data(), block.size,
                            std::vector<int64_t>(block.size.size(), 0), block.size, element);
      ASSIGN_OR_RETURN(std::unique_ptr<runtime::DeviceBuffer> buffer,
                       runtime.ToDevice(shard, device_indices[d]));
      if (metrics != nullptr) metrics->AddBytes(kTransferToDeviceBytes, shard.shape.ByteSize());
      out[d].push_back(std::move(buffer));
    }
  }
  return out;
}

}  // namespace meshrun::worker
