#include "coordinator_service/coordinator_limits.h"

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <limits>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "jobspec/spec_limits.h"
#include "rpc/tls_credentials.h"

namespace meshrun::services {

std::string ClientKey(const grpc::ServerContextBase& context) {
  if (std::optional<Identity> identity = PeerIdentity(context); identity.has_value()) {
    return RoleName(identity->role) + "/" + identity->name;
  }
  const std::string peer = context.peer();
  const size_t port = peer.rfind(':');
  return port == std::string::npos || port < peer.find(':') + 1 ? peer : peer.substr(0, port);
}

absl::Status CheckRequestLimits(const CoordinatorLimits& limits) {
  if (const int64_t bytes = limits.max_request_bytes;
      bytes < (int64_t{2} << 20) || bytes > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_request_bytes=", bytes, " is out of range: from 2 MiB (2097152; a 1 MiB "
        "program chunk or key-value value must fit) to 2 GiB - 1"));
  }
  if (const int64_t memory = limits.max_request_memory;
      memory != 0 && memory < limits.max_request_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_request_memory=", memory, " is below --max_request_bytes=",
        limits.max_request_bytes, ": give at least that, or 0 for no bound"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<SubmitAdmission>> SubmitAdmission::Create(
    const CoordinatorLimits& limits, const std::string& state_dir) {
  auto out = std::unique_ptr<SubmitAdmission>(new SubmitAdmission());
  ASSIGN_OR_RETURN(out->roots_, PathRoots::FromFlag(limits.data_roots,
                                       {std::filesystem::absolute(state_dir).string()}));
  ASSIGN_OR_RETURN(out->rate_, coordinator::RateLimiter::Create(
                                   {.per_second = limits.submit_rate,
                                    .burst = std::max(1.0, limits.submit_burst),
                                    .what = "SubmitJob calls"}));
  ASSIGN_OR_RETURN(out->programs_,
                   coordinator::ProgramStore::Create({.directory = state_dir + "/programs",
                                                      .max_bytes = limits.program_store_bytes}));
  return out;
}

absl::Status SubmitAdmission::Admit(const std::string& client, const v1::JobSpec& spec) {
  RETURN_IF_ERROR(rate_->Admit(client));
  return jobspec::CheckSpecPaths(spec, roots_);
}

}  // namespace meshrun::services
