#include "worker/host_identity.h"

#include <unistd.h>

#include <climits>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace meshrun::worker {
namespace {

absl::Status ReadNonNegative(const EnvLookup& env, const std::string& name, int* out) {
  std::optional<std::string> value = env(name);
  if (!value.has_value() || value->empty()) return absl::OkStatus();
  int parsed = 0;
  if (!absl::SimpleAtoi(*value, &parsed) || parsed < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "environment variable ", name, "=\"", *value, "\" is not a non-negative integer"));
  }
  *out = parsed;
  return absl::OkStatus();
}

std::string MachineHostName() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

absl::StatusOr<HostIdentity> ResolveHostIdentity(const HostIdentity& flags,
                                                 const EnvLookup& env) {
  HostIdentity id = flags;
  if (absl::Status s = ReadNonNegative(env, "TPU_WORKER_ID", &id.worker_index); !s.ok()) return s;
  if (absl::Status s = ReadNonNegative(env, "MEGASCALE_SLICE_ID", &id.slice_id); !s.ok()) return s;
  if (absl::Status s = ReadNonNegative(env, "MEGASCALE_NUM_SLICES", &id.num_slices); !s.ok()) {
    return s;
  }
  if (std::optional<std::string> names = env("TPU_WORKER_HOSTNAMES"); names && !names->empty()) {
    id.slice_hostnames.clear();
    for (absl::string_view name : absl::StrSplit(*names, ',', absl::SkipWhitespace())) {
      id.slice_hostnames.emplace_back(absl::StripAsciiWhitespace(name));
    }
  }
  if (id.num_slices < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slice count is ", id.num_slices, "; MEGASCALE_NUM_SLICES / --num_slices must be >= 1"));
  }
  if (id.slice_id >= id.num_slices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slice id ", id.slice_id, " is not below the slice count ", id.num_slices,
        "; check MEGASCALE_SLICE_ID / --slice_id"));
  }
  if (!id.slice_hostnames.empty() &&
      id.worker_index >= static_cast<int>(id.slice_hostnames.size())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "worker index ", id.worker_index, " is outside TPU_WORKER_HOSTNAMES, which names ",
        id.slice_hostnames.size(), " hosts; check TPU_WORKER_ID / --worker_index"));
  }
  if (id.host.empty()) {
    id.host = id.slice_hostnames.empty() ? MachineHostName() : id.slice_hostnames[id.worker_index];
  }
  return id;
}

std::vector<std::pair<std::string, std::string>> TpuRuntimeVariables(const HostIdentity& identity,
                                                                     const EnvLookup& resolved,
                                                                     const EnvLookup& process_env) {
  std::vector<std::pair<std::string, std::string>> wanted = {
      {"TPU_WORKER_ID", absl::StrCat(identity.worker_index)},
      {"TPU_WORKER_HOSTNAMES", identity.slice_hostnames.empty()
                                   ? identity.host
                                   : absl::StrJoin(identity.slice_hostnames, ",")},
      {"TPU_SKIP_MDS_QUERY", "1"}};
  if (std::optional<std::string> type = resolved("TPU_ACCELERATOR_TYPE")) {
    wanted.emplace_back("TPU_ACCELERATOR_TYPE", *type);
  }
  std::vector<std::pair<std::string, std::string>> out;
  for (auto& [name, value] : wanted) {
    if (!process_env(name).has_value()) out.emplace_back(name, std::move(value));
  }
  return out;
}

}  // namespace meshrun::worker
