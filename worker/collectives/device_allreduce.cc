#include "worker/collectives/device_allreduce.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace meshrun::worker::collectives {
namespace {

using runtime::DeviceBuffer;
using runtime::HostArray;

// Device -> host, then the all-reduce: the results on the host, in order.
absl::StatusOr<std::vector<HostArray>> ReduceToHost(runtime::Runtime& runtime,
                                                    HostAllReduce& allreduce,
                                                    absl::Span<DeviceBuffer* const> buffers,
                                                    const DeviceAllReduceOptions& options) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i]->shape().dtype != runtime::DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("all-reduce buffer ", i, " is ", runtime::ToString(buffers[i]->shape()),
                       " on device ", buffers[i]->device_index(), "; only f32 is reduced"));
    }
  }
  Clock& clock = *options.clock;
  std::vector<HostArray> host;
  host.reserve(buffers.size());
  for (DeviceBuffer* buffer : buffers) {
    const absl::Time start = clock.Now();
    ASSIGN_OR_RETURN(HostArray array, runtime.ToHost(*buffer));
    if (options.metrics != nullptr) {
      options.metrics->AddTime(kTransferFromDeviceTime, clock.Now() - start);
      options.metrics->AddBytes(kTransferFromDeviceBytes, static_cast<int64_t>(array.bytes.size()));
    }
    host.push_back(std::move(array));
  }
  // Reduced where they are: a HostArray's bytes are heap (or in-object) storage aligned for
  // float.
  std::vector<absl::Span<float>> spans;
  spans.reserve(host.size());
  int64_t bytes = 0;
  for (HostArray& array : host) {
    spans.emplace_back(reinterpret_cast<float*>(array.bytes.data()),
                       array.bytes.size() / sizeof(float));
    bytes += static_cast<int64_t>(array.bytes.size());
  }
  const absl::Time start = clock.Now();
  RETURN_IF_ERROR(allreduce.AllReduce(spans, options.op));
  if (options.metrics != nullptr) {
    options.metrics->AddTime(kAllReduceTime, clock.Now() - start);
    options.metrics->AddBytes(kAllReduceBytes, bytes);
  }
  return host;
}

absl::StatusOr<std::unique_ptr<DeviceBuffer>> Upload(runtime::Runtime& runtime,
                                                     const HostArray& array, int device_index,
                                                     const DeviceAllReduceOptions& options) {
  const absl::Time start = options.clock->Now();
  ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> buffer, runtime.ToDevice(array, device_index));
  if (options.metrics != nullptr) {
    options.metrics->AddTime(kTransferToDeviceTime, options.clock->Now() - start);
    options.metrics->AddBytes(kTransferToDeviceBytes, static_cast<int64_t>(array.bytes.size()));
  }
  return buffer;
}

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<DeviceBuffer>>> AllReduceDeviceBuffers(
    runtime::Runtime& runtime, HostAllReduce& allreduce, absl::Span<DeviceBuffer* const> buffers,
    const DeviceAllReduceOptions& options) {
  ASSIGN_OR_RETURN(std::vector<HostArray> host, ReduceToHost(runtime, allreduce, buffers, options));
  std::vector<std::unique_ptr<DeviceBuffer>> out;
  out.reserve(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    ASSIGN_OR_RETURN(out.emplace_back(),
                     Upload(runtime, host[i], buffers[i]->device_index(), options));
  }
  return out;
}

absl::Status AllReduceInPlace(runtime::Runtime& runtime, HostAllReduce& allreduce,
                              PerDeviceBuffers& buffers, const DeviceAllReduceOptions& options) {
  if (!options.replicated_across_devices) {
    std::vector<DeviceBuffer*> flat;
    for (auto& device : buffers) {
      for (auto& buffer : device) flat.push_back(buffer.get());
    }
    ASSIGN_OR_RETURN(auto reduced, AllReduceDeviceBuffers(runtime, allreduce, flat, options));
    size_t k = 0;
    for (auto& device : buffers) {
      for (auto& buffer : device) buffer = std::move(reduced[k++]);
    }
    return absl::OkStatus();
  }

  std::vector<DeviceBuffer*> first;
  if (!buffers.empty()) {
    for (auto& buffer : buffers[0]) first.push_back(buffer.get());
  }
  for (size_t d = 1; d < buffers.size(); ++d) {
    bool same = buffers[d].size() == first.size();
    for (size_t i = 0; same && i < first.size(); ++i) {
      same = buffers[d][i]->shape() == first[i]->shape();
    }
    if (!same) {
      return absl::InvalidArgumentError(absl::StrCat(
          "replicated_across_devices: device list ", d, " holds other arrays than device list 0; "
          "clear the option for sharded values"));
    }
  }
  ASSIGN_OR_RETURN(std::vector<HostArray> host, ReduceToHost(runtime, allreduce, first, options));
  PerDeviceBuffers reduced(buffers.size());
  for (size_t d = 0; d < buffers.size(); ++d) {
    for (size_t i = 0; i < first.size(); ++i) {
      ASSIGN_OR_RETURN(reduced[d].emplace_back(),
                       Upload(runtime, host[i], buffers[d][i]->device_index(), options));
    }
  }
  buffers = std::move(reduced);
  return absl::OkStatus();
}

}  // namespace meshrun::worker::collectives
