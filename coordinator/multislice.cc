#include "coordinator/multislice.h"

#include <algorithm>
#include <set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/natural_order.h"

namespace meshrun::coordinator {
namespace {

// "host:port" or "[v6]:port" -> the host part.
std::string HostPart(const std::string& address) {
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    return close == std::string::npos ? address : address.substr(1, close - 1);
  }
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || address.find(':') != colon) return address;
  return address.substr(0, colon);
}

}  // namespace

absl::StatusOr<SliceLayout> GroupSlices(const std::vector<WorkerInfo>& hosts, bool equal_sizes) {
  SliceLayout layout;
  const bool multislice = std::any_of(hosts.begin(), hosts.end(),
                                      [](const WorkerInfo& h) { return h.num_slices > 1; });
  if (!multislice) {
    layout.hosts.emplace_back();
    for (const WorkerInfo& host : hosts) layout.hosts[0].push_back(host.host);
    return layout;
  }
  std::map<int, std::vector<std::string>> by_count;
  for (const WorkerInfo& host : hosts) by_count[host.num_slices].push_back(host.host);
  if (by_count.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [count, names] : by_count) {
      parts.push_back(absl::StrCat(count, " on ", absl::StrJoin(names, ", ")));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "hosts disagree on the number of slices: ", absl::StrJoin(parts, "; "),
        "; restart them with one MEGASCALE_NUM_SLICES / --num_slices"));
  }
  layout.num_slices = by_count.begin()->first;
  layout.hosts.resize(static_cast<size_t>(layout.num_slices));
  std::vector<std::vector<const WorkerInfo*>> members(layout.hosts.size());
  for (const WorkerInfo& host : hosts) {
    if (host.slice_id < 0 || host.slice_id >= layout.num_slices) {
      return absl::FailedPreconditionError(absl::StrCat(
          "host ", host.host, " is in slice ", host.slice_id, " but there are ",
          layout.num_slices, " slices (ids 0..", layout.num_slices - 1,
          "); fix its MEGASCALE_SLICE_ID / --slice_id"));
    }
    members[static_cast<size_t>(host.slice_id)].push_back(&host);
  }
  std::vector<std::string> present, missing;
  for (int s = 0; s < layout.num_slices; ++s) {
    std::vector<const WorkerInfo*>& slice = members[static_cast<size_t>(s)];
    std::stable_sort(slice.begin(), slice.end(), [](const WorkerInfo* a, const WorkerInfo* b) {
      return a->worker_index != b->worker_index ? a->worker_index < b->worker_index
                                                : NaturalLess(a->host, b->host);
    });
    for (const WorkerInfo* host : slice) layout.hosts[static_cast<size_t>(s)].push_back(host->host);
    if (slice.empty()) {
      missing.push_back(absl::StrCat(s));
    } else {
      present.push_back(absl::StrCat("slice ", s, ": ",
                                     absl::StrJoin(layout.hosts[static_cast<size_t>(s)], ", ")));
    }
  }
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the hosts declare ", layout.num_slices, " slices but slice",
        missing.size() > 1 ? "s " : " ", absl::StrJoin(missing, ", "),
        missing.size() > 1 ? " have" : " has", " no live host (", absl::StrJoin(present, "; "),
        "); start the missing slice's hosts, or restart these with --num_slices=",
        layout.num_slices - static_cast<int>(missing.size()), " and consecutive slice ids"));
  }
  if (!equal_sizes) return layout;
  std::map<size_t, std::vector<std::string>> by_size;
  for (int s = 0; s < layout.num_slices; ++s) {
    by_size[layout.hosts[static_cast<size_t>(s)].size()].push_back(absl::StrCat(s));
  }
  if (by_size.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [size, slices] : by_size) {
      parts.push_back(absl::StrCat(size, size == 1 ? " host" : " hosts", " in slice",
                                   slices.size() > 1 ? "s " : " ", absl::StrJoin(slices, ", ")));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "slices differ in size: ", absl::StrJoin(parts, "; "), " (",
        absl::StrJoin(present, "; "),
        "); every slice of a multislice job needs the same number of hosts (one slice type)"));
  }
  for (int s = 0; s < layout.num_slices; ++s) {
    const std::vector<const WorkerInfo*>& slice = members[static_cast<size_t>(s)];
    for (size_t i = 1; i < slice.size(); ++i) {
      if (slice[i]->worker_index == slice[i - 1]->worker_index) {
        return absl::FailedPreconditionError(absl::StrCat(
            "hosts ", slice[i - 1]->host, " and ", slice[i]->host, " both claim worker index ",
            slice[i]->worker_index, " of slice ", s,
            "; fix TPU_WORKER_ID / --worker_index (0..", slice.size() - 1, " in each slice)"));
      }
    }
  }
  return layout;
}

std::map<std::string, runtime::MegascaleConfig> MegascaleByHost(
    const SliceLayout& layout, const std::vector<WorkerInfo>& hosts) {
  std::map<std::string, runtime::MegascaleConfig> out;
  if (layout.num_slices <= 1 || layout.hosts.empty() || layout.hosts[0].empty()) return out;
  std::string coordinator;
  for (const WorkerInfo& host : hosts) {
    if (host.host == layout.hosts[0][0]) coordinator = HostPart(host.address);
  }
  for (const WorkerInfo& host : hosts) {
    out[host.host] = runtime::MegascaleConfig{.coordinator_address = coordinator,
                                              .slice_id = host.slice_id,
                                              .num_slices = layout.num_slices};
  }
  return out;
}

}  // namespace meshrun::coordinator
