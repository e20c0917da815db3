#include "jobspec/memory_tier.h"

#include <algorithm>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "jobspec/job_validation.h"
#include "runtime/types.h"

namespace meshrun::jobspec {
namespace {

// The distinct state blocks `host`'s partitions hold, bytes.
absl::StatusOr<int64_t> OwnBlockBytes(const v1::JobSpec& spec, const v1::MeshAssignment& mesh,
                                      const std::string& host) {
  const v1::Program* state = nullptr;  // the program whose first inputs are the state
  for (const v1::Program& p : spec.programs()) {
    if (p.role() == (IsModeB(spec) ? "apply" : "step")) state = &p;
  }
  if (state == nullptr) return 0;
  const std::vector<std::string> axes(mesh.axis_names().begin(), mesh.axis_names().end());
  const std::vector<int64_t> shape(mesh.shape().begin(), mesh.shape().end());
  const std::vector<int64_t> partitions = PartitionsOf(mesh, host);
  int64_t bytes = 0;
  for (int i = 0; i < spec.state_count() && i < state->inputs_size(); ++i) {
    const v1::TensorSpec& input = state->inputs(i);
    ASSIGN_OR_RETURN(const runtime::DType dtype, runtime::ParseDType(input.dtype()));
    std::set<std::string> seen;
    for (int64_t partition : partitions) {
      ASSIGN_OR_RETURN(checkpoint::Block block,
                       checkpoint::BlockOf({input.shape().begin(), input.shape().end()},
                                           {input.sharding().begin(), input.sharding().end()},
                                           axes, shape, partition));
      if (!seen.insert(checkpoint::ChunkKey(block.start, block.size)).second) continue;
      int64_t elements = 1;
      for (int64_t n : block.size) elements *= n;
      bytes += elements * runtime::DTypeByteSize(dtype);
    }
  }
  return bytes;
}

}  // namespace

std::vector<int64_t> PartitionsOf(const v1::MeshAssignment& mesh, const std::string& host) {
  std::vector<int64_t> partitions;
  for (int p = 0; p < mesh.device_ids_size(); ++p) {
    if (mesh.device_hosts_size() == 0 || mesh.device_hosts(p) == host) {
      partitions.push_back(mesh.partitions_size() > 0 ? mesh.partitions(p) : p);
    }
  }
  return partitions;
}

std::vector<std::string> RingHosts(const v1::MeshAssignment& mesh) {
  std::vector<std::string> hosts;
  std::set<std::string_view> seen;  // a set, not a scan of `hosts`: O(D log N) at 1024 hosts
  for (const std::string& host : mesh.device_hosts()) {
    if (seen.insert(host).second) hosts.push_back(host);
  }
  if (hosts.size() < 2) hosts.clear();
  return hosts;
}

std::string RingPredecessor(const v1::MeshAssignment& mesh, const std::string& host) {
  const std::vector<std::string> ring = RingHosts(mesh);
  auto it = std::find(ring.begin(), ring.end(), host);
  if (it == ring.end()) return "";
  return it == ring.begin() ? ring.back() : *(it - 1);
}

absl::StatusOr<int64_t> MemoryTierHostBytes(const v1::JobSpec& spec,
                                            const v1::MeshAssignment& mesh,
                                            const std::string& host) {
  if (!spec.has_checkpoint() || MemoryCheckpointEvery(spec.checkpoint()) == 0) return 0;
  ASSIGN_OR_RETURN(int64_t bytes, OwnBlockBytes(spec, mesh, host));
  if (const std::string peer = RingPredecessor(mesh, host); !peer.empty()) {
    ASSIGN_OR_RETURN(const int64_t peer_bytes, OwnBlockBytes(spec, mesh, peer));
    bytes += peer_bytes;
  }
  return bytes * kMemoryCheckpointsKept;
}

absl::Status CheckMemoryTierFits(const v1::JobSpec& spec, const v1::MeshAssignment& mesh,
                                 const std::string& host, int64_t available) {
  if (available <= 0) return absl::OkStatus();
  ASSIGN_OR_RETURN(const int64_t needed, MemoryTierHostBytes(spec, mesh, host));
  if (needed <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      "in-memory checkpoints need ", needed, " bytes of host memory on ", host, " (",
      kMemoryCheckpointsKept, " steps of its state blocks",
      RingPredecessor(mesh, host).empty() ? "" : " and of its ring peer's", ") but the worker "
      "offers ", available, " (its --memory_checkpoint_bytes, else MemAvailable); set "
      "spec.checkpoint.memory_every_steps to 0 (meshrun submit --memory_checkpoint_every=0) or "
      "give the host more memory"));
}

}  // namespace meshrun::jobspec
