#include "worker/collectives/device_allreduce.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace meshrun::worker::collectives {

absl::StatusOr<std::vector<std::unique_ptr<runtime::DeviceBuffer>>> AllReduceDeviceBuffers(
    runtime::Runtime& runtime, HostAllReduce& allreduce,
    absl::Span<runtime::DeviceBuffer* const> buffers, const DeviceAllReduceOptions& options) {
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i]->shape().dtype != runtime::DType::kF32) {
      return absl::InvalidArgumentError(
          absl::StrCat("all-reduce buffer ", i, " is ", runtime::ToString(buffers[i]->shape()),
                       " on device ", buffers[i]->device_index(), "; only f32 is reduced"));
    }
  }
  Clock& clock = *options.clock;
  Metrics* metrics = options.metrics;

  std::vector<runtime::HostArray> host;
  host.reserve(buffers.size());
  for (runtime::DeviceBuffer* buffer : buffers) {
    const absl::Time start = clock.Now();
    ASSIGN_OR_RETURN(runtime::HostArray array, runtime.ToHost(*buffer));
    if (metrics != nullptr) {
      metrics->AddTime(kTransferFromDeviceTime, clock.Now() - start);
      metrics->AddBytes(kTransferFromDeviceBytes, static_cast<int64_t>(array.bytes.size()));
    }
    host.push_back(std::move(array));
  }

  // The host copies are reduced where they are: a HostArray's bytes are heap (or in-object)
  // storage aligned for float.
  std::vector<absl::Span<float>> spans;
  spans.reserve(host.size());
  int64_t bytes = 0;
  for (runtime::HostArray& array : host) {
    spans.emplace_back(reinterpret_cast<float*>(array.bytes.data()),
                       array.bytes.size() / sizeof(float));
    bytes += static_cast<int64_t>(array.bytes.size());
  }
  const absl::Time start = clock.Now();
  RETURN_IF_ERROR(allreduce.AllReduce(spans, options.op));
  if (metrics != nullptr) {
    metrics->AddTime(kAllReduceTime, clock.Now() - start);
    metrics->AddBytes(kAllReduceBytes, bytes);
  }

  std::vector<std::unique_ptr<runtime::DeviceBuffer>> out;
  out.reserve(buffers.size());
  for (size_t i = 0; i < buffers.size(); ++i) {
    const absl::Time start = clock.Now();
    ASSIGN_OR_RETURN(std::unique_ptr<runtime::DeviceBuffer> buffer,
                     runtime.ToDevice(host[i], buffers[i]->device_index()));
    if (metrics != nullptr) {
      metrics->AddTime(kTransferToDeviceTime, clock.Now() - start);
      metrics->AddBytes(kTransferToDeviceBytes, static_cast<int64_t>(host[i].bytes.size()));
    }
    out.push_back(std::move(buffer));
  }
  return out;
}

}  // namespace meshrun::worker::collectives
