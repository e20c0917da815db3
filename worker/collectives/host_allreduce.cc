#include "worker/collectives/host_allreduce.h"

#include <net/if.h>

#include <chrono>
#include <exception>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/transport/tcp/device.h"
#include "spdlog/spdlog.h"
#include "worker/collectives/kv_gloo_store.h"

namespace meshrun::worker::collectives {
namespace {

using ReduceFn = void (*)(void*, const void*, const void*, size_t);

std::chrono::milliseconds Millis(absl::Duration d) {
  return std::chrono::milliseconds(absl::ToInt64Milliseconds(d));
}

// gloo reports every failure by exception; a timeout says so in its text.
absl::Status FromGloo(const std::string& what, const std::exception& e) {
  const std::string message = absl::StrCat(what, ": ", e.what());
  if (absl::StrContains(e.what(), "Timed out") || absl::StrContains(e.what(), "no value for")) {
    return absl::DeadlineExceededError(message);
  }
  return absl::UnavailableError(message);
}

// One ring all-reduce of `count` elements in place. Throws gloo's exceptions.
template <typename T>
void RingAllreduce(const std::shared_ptr<gloo::Context>& context, T* data, size_t count,
                   ReduceFn reduce, absl::Duration timeout) {
  gloo::AllreduceOptions options(context);
  options.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
  options.setOutput(data, count);
  options.setReduceFunction(reduce);
  options.setTimeout(Millis(timeout));
  gloo::allreduce(options);
}

absl::Status CheckConfig(const HostAllReduce::Config& c) {
  if (c.size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("size is ", c.size, "; give the number of ranks (>= 1)"));
  }
  if (c.rank < 0 || c.rank >= c.size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank is ", c.rank, "; give a rank in [0, ", c.size, ")"));
  }
  if (!c.peer_names.empty() && static_cast<int>(c.peer_names.size()) != c.size) {
    return absl::InvalidArgumentError(absl::StrCat("peer_names has ", c.peer_names.size(),
                                                   " names for ", c.size,
                                                   " ranks; give one per rank or none"));
  }
  if (c.size == 1) return absl::OkStatus();
  if (c.store == nullptr) {
    return absl::InvalidArgumentError("store is null; give the rendezvous key-value client");
  }
  if (c.prefix.empty() || absl::EndsWith(c.prefix, "/")) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prefix '", c.prefix, "' is empty or ends in '/'; give a job-scoped prefix such as "
        "'collectives/<job id>/<attempt>'"));
  }
  if (c.bind_address.empty() && c.network_interface.empty()) {
    return absl::InvalidArgumentError(
        "bind_address and network_interface are both empty; give one (e.g. 127.0.0.1)");
  }
  // Checked here: gloo's own lookup leaks when the interface is missing.
  if (!c.network_interface.empty() && if_nametoindex(c.network_interface.c_str()) == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "network_interface '", c.network_interface,
        "' is not an interface of this host; give one that `ip link` lists, or a bind_address"));
  }
  if (c.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("timeout is ", absl::FormatDuration(c.timeout),
                                                   "; give a positive duration"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HostAllReduce>> HostAllReduce::Create(Config config) {
  RETURN_IF_ERROR(CheckConfig(config));
  std::unique_ptr<HostAllReduce> out(new HostAllReduce(std::move(config)));
  if (out->size() > 1) RETURN_IF_ERROR(out->Rendezvous());
  return out;
}

HostAllReduce::HostAllReduce(Config config) : config_(std::move(config)) {}

HostAllReduce::~HostAllReduce() = default;

std::string HostAllReduce::PeerName(int rank) const {
  if (config_.peer_names.empty()) return absl::StrCat("rank ", rank);
  return absl::StrCat("rank ", rank, " (", config_.peer_names[rank], ")");
}

absl::Status HostAllReduce::Rendezvous() {
  const std::string where = absl::StrCat("all-reduce rendezvous '", config_.prefix, "' (",
                                         PeerName(config_.rank), " of ", config_.size, ")");
  gloo::transport::tcp::attr attr;
  if (!config_.network_interface.empty()) {
    attr.iface = config_.network_interface;
  } else {
    attr.hostname = config_.bind_address;
  }
  std::shared_ptr<gloo::transport::Device> device;
  try {
    device = gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": cannot listen on ",
        config_.network_interface.empty() ? "bind_address '" + config_.bind_address + "'"
                                          : "network_interface '" + config_.network_interface + "'",
        " (", e.what(), "); give an address or interface of this host"));
  }
  auto context = std::make_shared<gloo::rendezvous::Context>(config_.rank, config_.size);
  context->setTimeout(Millis(config_.timeout));

  // Arrival first, with one deadline for all peers, so a timeout names every absent rank
  // (gloo's own exchange waits for peers one at a time).
  KeyValueGlooStore arrivals(config_.store, config_.prefix + "/arrived", config_.timeout);
  KeyValueGlooStore mesh(config_.store, config_.prefix + "/mesh", config_.timeout);
  absl::Status status = [&]() -> absl::Status {
    try {
      const std::string name = PeerName(config_.rank);
      arrivals.set(std::to_string(config_.rank), std::vector<char>(name.begin(), name.end()));
    } catch (const std::exception& e) {
      return absl::UnavailableError(absl::StrCat(where, ": ", e.what()));
    }
    std::vector<std::string> others;
    for (int i = 0; i < config_.size; ++i) {
      if (i != config_.rank) others.push_back(std::to_string(i));
    }
    absl::StatusOr<std::vector<std::string>> missing = arrivals.Missing(others, config_.timeout);
    if (!missing.ok()) {
      return absl::Status(missing.status().code(),
                          absl::StrCat(where, ": ", missing.status().message()));
    }
    if (!missing->empty()) {
      std::vector<std::string> names;
      for (const std::string& rank : *missing) names.push_back(PeerName(std::stoi(rank)));
      return absl::DeadlineExceededError(
          absl::StrCat(where, ": ", absl::StrJoin(names, ", "), " did not arrive within ",
                       absl::FormatDuration(config_.timeout), " (", config_.size - missing->size(),
                       " of ", config_.size, " ranks arrived)"));
    }
    try {
      context->connectFullMesh(mesh, device);
    } catch (const std::exception& e) {
      return FromGloo(absl::StrCat(where, ": connecting to the peers"), e);
    }
    // After the barrier every rank has read every address: the keys can go.
    try {
      gloo::BarrierOptions barrier(context);
      barrier.setTimeout(Millis(config_.timeout));
      gloo::barrier(barrier);
    } catch (const std::exception& e) {
      return FromGloo(absl::StrCat(where, ": barrier after connecting"), e);
    }
    return absl::OkStatus();
  }();
  for (KeyValueGlooStore* store : {&arrivals, &mesh}) {
    absl::Status deleted = store->DeleteOwnKeys();
    if (!deleted.ok()) {
      spdlog::warn("{}: could not delete its rendezvous keys: {}", where, deleted.ToString());
    }
  }
  if (!status.ok()) return status;
  context_ = std::move(context);
  return absl::OkStatus();
}

absl::Status HostAllReduce::CheckLayout(int64_t buffers, int64_t elements) {
  // Max of each value and of its negation gives the range over ranks in one small pass;
  // without it, mismatched lengths would corrupt the ring or stall it until the timeout.
  int64_t layout[4] = {buffers, -buffers, elements, -elements};
  RingAllreduce<int64_t>(context_, layout, 4,
                         static_cast<ReduceFn>(&gloo::max<int64_t>), config_.timeout);
  if (layout[0] != -layout[1] || layout[2] != -layout[3]) {
    return absl::FailedPreconditionError(absl::StrCat(
        "all-reduce layout differs between ranks: buffers range over [", -layout[1], ", ",
        layout[0], "], floats over [", -layout[3], ", ", layout[2], "]; ",
        PeerName(config_.rank), " has ", buffers, " buffers of ", elements,
        " floats. Every rank must pass the same buffers in the same order"));
  }
  return absl::OkStatus();
}

void HostAllReduce::Collective(float* data, size_t count, ReduceOp op) {
  RingAllreduce<float>(context_, data, count, static_cast<ReduceFn>(&gloo::sum<float>),
                       config_.timeout);
  if (op == ReduceOp::kMean) {
    const float n = static_cast<float>(config_.size);
    for (size_t i = 0; i < count; ++i) data[i] /= n;
  }
}

absl::Status HostAllReduce::AllReduce(absl::Span<const absl::Span<float>> buffers, ReduceOp op) {
  if (config_.size == 1) return absl::OkStatus();  // one rank: the sum and the mean are itself
  absl::MutexLock l(&mu_);
  if (!failed_.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "all-reduce '", config_.prefix, "' is unusable after an earlier failure (",
        failed_.message(), "); rendezvous again under a new prefix"));
  }
  size_t total = 0;
  int non_empty = 0;
  float* only = nullptr;
  for (absl::Span<float> b : buffers) {
    total += b.size();
    if (!b.empty()) {
      ++non_empty;
      only = b.data();
    }
  }
  const int64_t round = rounds_++;
  try {
    RETURN_IF_ERROR(
        CheckLayout(static_cast<int64_t>(buffers.size()), static_cast<int64_t>(total)));
    if (total == 0) return absl::OkStatus();
    if (non_empty == 1) {
      Collective(only, total, op);
      return absl::OkStatus();
    }
    staging_.resize(total);
    size_t offset = 0;
    for (absl::Span<float> b : buffers) {
      std::copy(b.begin(), b.end(), staging_.begin() + offset);
      offset += b.size();
    }
    Collective(staging_.data(), total, op);
    offset = 0;
    for (absl::Span<float> b : buffers) {
      std::copy(staging_.begin() + offset, staging_.begin() + offset + b.size(), b.begin());
      offset += b.size();
    }
    return absl::OkStatus();
  } catch (const std::exception& e) {
    failed_ = FromGloo(absl::StrCat("all-reduce '", config_.prefix, "' round ", round, " of ",
                                    total, " floats on ", PeerName(config_.rank), " of ",
                                    config_.size, " (a peer is gone or stalled)"),
                       e);
    return failed_;
  }
}

}  // namespace meshrun::worker::collectives
