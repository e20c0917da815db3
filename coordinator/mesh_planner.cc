#include "coordinator/mesh_planner.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/natural_order.h"
#include "common/status_macros.h"
#include "coordinator/multislice.h"

namespace meshrun::coordinator {
namespace {

using runtime::DeviceDescription;
using runtime::RuntimeIdentity;

void SortHosts(std::vector<WorkerInfo>& hosts) {
  std::stable_sort(hosts.begin(), hosts.end(), [](const WorkerInfo& a, const WorkerInfo& b) {
    if (a.slice_id != b.slice_id) return a.slice_id < b.slice_id;
    if (a.worker_index != b.worker_index) return a.worker_index < b.worker_index;
    return NaturalLess(a.host, b.host);
  });
}

// "dp=8 tp=2" style, leaving out axes of size 1 except dp; "dp=16 (dcn 2 x ici 8)" over slices.
std::string Sizes(int64_t dp, int64_t ep, int64_t tp, int64_t slices = 1) {
  std::string out = absl::StrCat("dp=", dp);
  if (slices > 1) absl::StrAppend(&out, " (dcn ", slices, " x ici ", dp / slices, ")");
  if (ep > 1) absl::StrAppend(&out, " ep=", ep);
  if (tp > 1) absl::StrAppend(&out, " tp=", tp);
  return out;
}

// What fits `devices` devices on hosts of `per_host` chips in `slices` slices, keeping the
// requested ep when it can be kept. Never empty: dp=devices always fits.
std::string Fits(int64_t devices, int64_t per_host, int requested_ep, int64_t slices = 1) {
  const int64_t per_slice = devices / slices;
  const int64_t ep = (requested_ep > 1 && per_slice % requested_ep == 0) ? requested_ep : 1;
  std::vector<std::string> options;
  for (int64_t tp = 1; tp <= per_host; ++tp) {
    if (per_host % tp != 0 || per_slice % (ep * tp) != 0) continue;
    options.push_back(Sizes(devices / (ep * tp), ep, tp, slices));
  }
  return absl::StrCat("fits: ", absl::StrJoin(options, ", "), " (dp*ep*tp = ", devices,
                      " devices, tp dividing the ", per_host, " chips of a host",
                      slices > 1 ? absl::StrCat(", ep*tp dividing the ", per_slice,
                                                " devices of a slice")
                                 : "",
                      ")");
}

// Groups hosts by a per-host label, in order of first appearance: "8 on a, b; 4 on c".
template <typename LabelFn>
std::vector<std::pair<std::string, std::vector<std::string>>> GroupHosts(
    const std::vector<WorkerInfo>& hosts, LabelFn label) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const WorkerInfo& host : hosts) {
    const std::string key = label(host);
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const auto& group) { return group.first == key; });
    if (it == groups.end()) {
      groups.push_back({key, {host.host}});
    } else {
      it->second.push_back(host.host);
    }
  }
  return groups;
}

std::string DescribeGroups(
    const std::vector<std::pair<std::string, std::vector<std::string>>>& groups) {
  std::vector<std::string> parts;
  for (const auto& [label, names] : groups) {
    parts.push_back(absl::StrCat(label, " on ", absl::StrJoin(names, ", ")));
  }
  return absl::StrJoin(parts, "; ");
}

std::vector<size_t> LocalIdOrder(const std::vector<DeviceDescription>& devices) {
  std::vector<size_t> order(devices.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::tie(devices[a].local_id, devices[a].global_id) <
           std::tie(devices[b].local_id, devices[b].global_id);
  });
  return order;
}

std::string DifferingFields(const RuntimeIdentity& a, const RuntimeIdentity& b) {
  std::vector<std::string> fields;
  if (a.platform_name != b.platform_name) fields.push_back("platform");
  if (a.platform_version != b.platform_version) fields.push_back("platform version");
  if (a.pjrt_api_major != b.pjrt_api_major || a.pjrt_api_minor != b.pjrt_api_minor) {
    fields.push_back("PJRT API version");
  }
  if (a.plugin_sha256 != b.plugin_sha256) fields.push_back("plugin sha256");
  return absl::StrJoin(fields, ", ");
}

}  // namespace

std::vector<std::string> MeshAxisNames(int ep, int tp) {
  std::vector<std::string> names = {"data"};
  if (ep > 1) names.push_back("expert");
  if (tp > 1) names.push_back("model");
  return names;
}

std::string MeshPlan::ToString() const {
  std::vector<std::string> axes;
  for (size_t i = 0; i < axis_names.size() && i < shape.size(); ++i) {
    axes.push_back(absl::StrCat(axis_names[i], "=", shape[i]));
    if (i < dcn_shape.size() && i < ici_shape.size() && dcn_shape[i] > 1) {
      absl::StrAppend(&axes.back(), " (dcn ", dcn_shape[i], " x ici ", ici_shape[i], ")");
    }
  }
  const std::string slices = num_slices > 1 ? absl::StrCat(" in ", num_slices, " slices") : "";
  const std::string where =
      replica_hosts.size() > 1
          ? absl::StrCat(" on each of ", replica_hosts.size(), " hosts", slices,
                         " (data-parallel, ")
          : absl::StrCat(" on ", hosts.size(), hosts.size() == 1 ? " host" : " hosts", slices,
                         " (");
  return absl::StrCat(absl::StrJoin(axes, " x "), where, runtime::ToString(runtime), ")");
}

std::vector<size_t> IciChipOrder(const std::vector<DeviceDescription>& devices, int tp) {
  const size_t n = devices.size();
  if (n <= 1) return LocalIdOrder(devices);
  // Usable coords: every device has them, with one length, distinct, filling a full box.
  const size_t rank = devices[0].coords.size();
  if (rank == 0) return LocalIdOrder(devices);
  std::vector<int32_t> lo(devices[0].coords), hi(devices[0].coords);
  std::map<std::vector<int32_t>, size_t> at;
  for (size_t i = 0; i < n; ++i) {
    const std::vector<int32_t>& c = devices[i].coords;
    if (c.size() != rank || !at.emplace(c, i).second) return LocalIdOrder(devices);
    for (size_t d = 0; d < rank; ++d) {
      lo[d] = std::min(lo[d], c[d]);
      hi[d] = std::max(hi[d], c[d]);
    }
  }
  std::vector<size_t> varying;  // dims with extent > 1
  int64_t volume = 1;
  for (size_t d = 0; d < rank; ++d) {
    const int64_t extent = int64_t{hi[d]} - lo[d] + 1;
    volume *= extent;
    if (volume > static_cast<int64_t>(n)) return LocalIdOrder(devices);
    if (extent > 1) varying.push_back(d);
  }
  if (volume != static_cast<int64_t>(n)) return LocalIdOrder(devices);
  auto extent = [&](size_t d) { return static_cast<int64_t>(hi[d]) - lo[d] + 1; };

  std::vector<size_t> order;
  order.reserve(n);
  auto emit = [&](std::vector<int32_t> coord) { order.push_back(at.at(coord)); };

  // 2xW grid and model groups of an even size >= 4: each group a closed ring of tp/2 columns.
  if (varying.size() == 2 && tp >= 4 && tp % 2 == 0 && n % static_cast<size_t>(tp) == 0 &&
      (extent(varying[0]) == 2 || extent(varying[1]) == 2)) {
    const size_t row_dim = extent(varying[0]) == 2 ? varying[0] : varying[1];
    const size_t col_dim = row_dim == varying[0] ? varying[1] : varying[0];
    const int64_t width = extent(col_dim);
    const int64_t block = tp / 2;
    for (int64_t start = 0; start < width; start += block) {
      std::vector<int32_t> coord = lo;
      for (int64_t c = start; c < start + block; ++c) {
        coord[row_dim] = lo[row_dim];
        coord[col_dim] = static_cast<int32_t>(lo[col_dim] + c);
        emit(coord);
      }
      for (int64_t c = start + block - 1; c >= start; --c) {
        coord[row_dim] = lo[row_dim] + 1;
        coord[col_dim] = static_cast<int32_t>(lo[col_dim] + c);
        emit(coord);
      }
    }
    return order;
  }

  // Boustrophedon over the varying dims: the largest extent slowest, the lowest dim fastest
  // among equals. A dim runs backwards whenever the counter of the slower dims is odd, so each
  // step moves one hop along one dim.
  std::vector<size_t> dims = varying;  // slow -> fast
  std::stable_sort(dims.begin(), dims.end(), [&](size_t a, size_t b) {
    return std::make_tuple(-extent(a), -static_cast<int64_t>(a)) <
           std::make_tuple(-extent(b), -static_cast<int64_t>(b));
  });
  for (size_t i = 0; i < n; ++i) {
    std::vector<int64_t> raw(dims.size());
    size_t rest = i;
    for (size_t k = dims.size(); k-- > 0;) {
      raw[k] = static_cast<int64_t>(rest % static_cast<size_t>(extent(dims[k])));
      rest /= static_cast<size_t>(extent(dims[k]));
    }
    std::vector<int32_t> coord = lo;
    int64_t slower = 0;  // counter of dims before k
    for (size_t k = 0; k < dims.size(); ++k) {
      const int64_t size = extent(dims[k]);
      const int64_t pos = (slower % 2 == 1) ? size - 1 - raw[k] : raw[k];
      coord[dims[k]] = static_cast<int32_t>(lo[dims[k]] + pos);
      slower = slower * size + raw[k];
    }
    emit(coord);
  }
  return order;
}

absl::StatusOr<MeshPlan> PlanMesh(const MeshRequest& request, std::vector<WorkerInfo> hosts) {
  if (request.dp < 0 || request.ep < 0 || request.tp < 0) {
    return absl::InvalidArgumentError(absl::StrCat("mesh sizes must be >= 0 (0 = auto), got dp=",
                                                   request.dp, " ep=", request.ep,
                                                   " tp=", request.tp));
  }
  if (hosts.empty()) {
    return absl::FailedPreconditionError(
        "no eligible hosts: a mesh needs at least one live host with the job's runtime");
  }
  SortHosts(hosts);

  std::set<std::string> names;
  std::map<int32_t, std::string> device_owner;
  for (const WorkerInfo& host : hosts) {
    if (host.host.empty()) return absl::InvalidArgumentError("a host has an empty name");
    if (!names.insert(host.host).second) {
      return absl::InvalidArgumentError(absl::StrCat("host ", host.host, " is listed twice"));
    }
    for (const DeviceDescription& device : host.devices) {
      auto [it, inserted] = device_owner.emplace(device.global_id, host.host);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat("global device id ", device.global_id,
                                                       " appears on ", it->second, " and on ",
                                                       host.host));
      }
    }
  }
  for (const WorkerInfo& host : hosts) {
    if (host.devices.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("host ", host.host, " has no devices; drop it from the job's hosts"));
    }
  }
  const auto runtimes = GroupHosts(
      hosts, [](const WorkerInfo& h) { return runtime::ToString(h.runtime); });
  if (runtimes.size() > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("hosts run different runtimes: ", DescribeGroups(runtimes),
                     "; a job needs one runtime on every host: pin one"));
  }
  const auto counts = GroupHosts(
      hosts, [](const WorkerInfo& h) { return absl::StrCat(h.devices.size(), " devices"); });
  if (counts.size() > 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("hosts have different device counts: ", DescribeGroups(counts),
                     "; a mesh needs the same count on every host"));
  }

  ASSIGN_OR_RETURN(const SliceLayout slices, GroupSlices(hosts, /*equal_sizes=*/true));
  const int64_t num_slices = slices.num_slices;
  const int64_t per_host = static_cast<int64_t>(hosts[0].devices.size());
  const int64_t devices = per_host * static_cast<int64_t>(hosts.size());
  const int64_t per_slice = devices / num_slices;
  const std::string where = absl::StrCat(
      devices, " devices (", hosts.size(), hosts.size() == 1 ? " host of " : " hosts of ",
      per_host, num_slices > 1 ? absl::StrCat(" in ", num_slices, " slices") : "", ")");
  auto refuse = [&](const std::string& what) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, "; ", Fits(devices, per_host, request.ep, num_slices)));
  };
  if (request.tp > per_host) {
    return refuse(absl::StrCat("tp=", request.tp, " exceeds the ", per_host,
                               " chips of one host; use tp<=", per_host));
  }
  for (const auto& [name, value] :
       {std::pair<const char*, int>{"dp", request.dp}, {"ep", request.ep}}) {
    if (value > devices) {
      return refuse(absl::StrCat("not enough devices: ", name, "=", value, " but there are ",
                                 where));
    }
  }

  const int64_t ep = request.ep > 0 ? request.ep : 1;
  int64_t tp = request.tp;
  const bool tp_auto = tp == 0;
  if (tp_auto) {
    tp = 1;
    if (request.dp > 0) {
      const int64_t fixed = int64_t{request.dp} * ep;
      if (fixed > devices) {
        return refuse(absl::StrCat("not enough devices: dp*ep=", fixed, " needs ", fixed,
                                   " devices but there are ", where));
      }
      if (devices % fixed != 0) {
        return refuse(absl::StrCat("dp*ep=", fixed, " does not divide ", devices, " devices"));
      }
      tp = devices / fixed;
    }
  }
  const std::string tp_text = absl::StrCat("tp=", tp, tp_auto ? " (auto)" : "");
  if (tp > per_host) {
    return refuse(absl::StrCat(tp_text, " exceeds the ", per_host,
                               " chips of one host; use tp<=", per_host));
  }
  if (per_host % tp != 0) {
    return refuse(absl::StrCat(tp_text, " does not divide the ", per_host,
                               " chips of one host (a model group must lie within one host)"));
  }
  int64_t dp = request.dp;
  if (dp == 0) {
    if (devices % (ep * tp) != 0) {
      return refuse(absl::StrCat("ep*tp=", ep * tp, " does not divide ", devices, " devices"));
    }
    dp = devices / (ep * tp);
  }
  const int64_t product = dp * ep * tp;
  if (product > devices) {
    return refuse(absl::StrCat("not enough devices: dp*ep*tp=", product, " needs ", product,
                               " devices but there are ", where));
  }
  if (devices % product != 0) {
    return refuse(absl::StrCat("dp*ep*tp=", product, " does not divide ", devices, " devices"));
  }
  if (product < devices) {
    std::string fewer;
    if (product % per_host == 0) {
      fewer = absl::StrCat(", or give the job ", product / per_host, " of the hosts");
    }
    return refuse(absl::StrCat("dp*ep*tp=", product, " uses only ", product, " of ", where,
                               " and a mesh spans every device of its hosts", fewer));
  }

  if (num_slices > 1 && per_slice % (ep * tp) != 0) {
    return refuse(absl::StrCat("an expert x model group of ep*tp=", ep * tp,
                               " devices would span slices; it must lie within one slice of ",
                               per_slice, " devices"));
  }

  MeshPlan plan;
  plan.dp = static_cast<int>(dp);
  plan.ep = static_cast<int>(ep);
  plan.tp = static_cast<int>(tp);
  plan.axis_names = MeshAxisNames(plan.ep, plan.tp);
  plan.shape.push_back(dp);
  if (ep > 1) plan.shape.push_back(ep);
  if (tp > 1) plan.shape.push_back(tp);
  plan.runtime = hosts[0].runtime;
  plan.device_ids.reserve(static_cast<size_t>(devices));
  plan.device_hosts.reserve(static_cast<size_t>(devices));
  for (const WorkerInfo& host : hosts) {
    plan.hosts.push_back(host.host);
    for (size_t index : IciChipOrder(host.devices, plan.tp)) {
      plan.device_ids.push_back(host.devices[index].global_id);
      plan.device_hosts.push_back(host.host);
    }
  }
  if (num_slices > 1) {
    plan.num_slices = static_cast<int>(num_slices);
    plan.dcn_shape.assign(plan.shape.size(), 1);
    plan.dcn_shape[0] = num_slices;
    plan.ici_shape = plan.shape;
    plan.ici_shape[0] = dp / num_slices;
    for (const WorkerInfo& host : hosts) plan.host_slices[host.host] = host.slice_id;
    plan.megascale = MegascaleByHost(slices, hosts);
  }
  return plan;
}

absl::StatusOr<MeshPlan> PlanCpuJob(const MeshRequest& request, int replicas,
                                    const std::vector<WorkerInfo>& eligible,
                                    const std::set<std::string>& busy) {
  if (replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("mesh.host_replicas is ", replicas, "; use 1 (or 0) for one host"));
  }
  ASSIGN_OR_RETURN(const SliceLayout slices, GroupSlices(eligible, /*equal_sizes=*/false));
  if (replicas % slices.num_slices != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "mesh.host_replicas is ", replicas, " but the hosts form ", slices.num_slices,
        " slices and replicas are spread evenly over them; use a multiple of ",
        slices.num_slices));
  }
  const int per_slice = replicas / slices.num_slices;
  std::map<int, int> taken;  // by slice
  std::optional<MeshPlan> plan;
  std::vector<std::string> chosen, passed_over;
  std::vector<WorkerInfo> chosen_hosts;
  int busy_fits = 0;
  for (const WorkerInfo& host : eligible) {
    if (static_cast<int>(chosen.size()) == replicas) break;
    const int slice = slices.num_slices > 1 ? host.slice_id : 0;
    if (taken[slice] == per_slice) continue;
    WorkerInfo alone = host;  // one host's own mesh: no slices inside it
    alone.slice_id = 0;
    alone.num_slices = 1;
    absl::StatusOr<MeshPlan> one = PlanMesh(request, {alone});
    if (!one.ok()) {
      passed_over.push_back(absl::StrCat(host.host, ": ", one.status().message()));
    } else if (plan.has_value() && one->device_ids != plan->device_ids) {
      passed_over.push_back(absl::StrCat(host.host, ": its device ids differ from ",
                                         chosen.front(), "'s"));
    } else if (busy.contains(host.host)) {
      passed_over.push_back(absl::StrCat(host.host, ": running another job"));
      ++busy_fits;
    } else {
      if (!plan.has_value()) plan = *std::move(one);
      chosen.push_back(host.host);
      chosen_hosts.push_back(host);
      ++taken[slice];
    }
  }
  if (static_cast<int>(chosen.size()) < replicas) {
    const std::string message = absl::StrCat(
        "the job needs ", replicas, replicas == 1 ? " CPU host" : " CPU hosts",
        slices.num_slices > 1 ? absl::StrCat(" (", per_slice, " in each of ",
                                             slices.num_slices, " slices)")
                              : "",
        " with a free worker its mesh fits; ", chosen.size(), " found",
        passed_over.empty() ? "" : " (", absl::StrJoin(passed_over, "; "),
        passed_over.empty() ? "" : ")");
    if (static_cast<int>(chosen.size()) + busy_fits >= replicas) {
      return absl::UnavailableError(absl::StrCat(message, "; retry when a job ends"));
    }
    return absl::FailedPreconditionError(message);
  }
  plan->hosts = chosen;
  if (replicas > 1) {
    plan->replica_hosts = chosen;
    plan->device_hosts.clear();
  }
  if (slices.num_slices > 1) {
    plan->num_slices = slices.num_slices;
    for (const WorkerInfo& host : chosen_hosts) plan->host_slices[host.host] = host.slice_id;
    ASSIGN_OR_RETURN(const SliceLayout used, GroupSlices(chosen_hosts, /*equal_sizes=*/false));
    plan->megascale = MegascaleByHost(used, chosen_hosts);
  }
  return *std::move(plan);
}

PinResult PinRuntime(std::vector<WorkerInfo> hosts, const RuntimeIdentity& pin) {
  SortHosts(hosts);
  PinResult result;
  result.pin = pin;
  if (result.pin.empty()) {
    for (const WorkerInfo& host : hosts) {
      if (!host.runtime.empty() && !host.devices.empty()) {
        result.pin = host.runtime;
        break;
      }
    }
  }
  const std::string pin_text = runtime::ToString(result.pin);
  for (WorkerInfo& host : hosts) {
    std::string reason;
    if (host.runtime.empty()) {
      reason = "no runtime loaded";
    } else if (host.devices.empty()) {
      reason = absl::StrCat("runtime ", runtime::ToString(host.runtime), " reports no devices");
    } else if (!(host.runtime == result.pin)) {
      reason = absl::StrCat("runtime ", runtime::ToString(host.runtime),
                            " differs from the job's pin ", pin_text, " (",
                            DifferingFields(host.runtime, result.pin), ")");
    }
    if (reason.empty()) {
      result.eligible.push_back(std::move(host));
    } else {
      result.excluded.push_back({host.host, std::move(reason)});
    }
  }
  return result;
}

}  // namespace meshrun::coordinator
