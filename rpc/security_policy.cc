#include "rpc/security_policy.h"

#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/sha256.h"

namespace meshrun::services {

std::string RoleName(Role role) {
  switch (role) {
    case Role::kView: return "view";
    case Role::kSubmit: return "submit";
    case Role::kAdmin: return "admin";
    case Role::kWorker: return "worker";
    case Role::kCoordinator: return "coordinator";
    case Role::kAnyAuthenticated: return "any authenticated identity";
    case Role::kMetrics: return "metrics";
  }
  return "unknown";
}

absl::StatusOr<Role> ParseRole(const std::string& name) {
  for (Role role : {Role::kView, Role::kSubmit, Role::kAdmin, Role::kWorker, Role::kCoordinator,
                    Role::kMetrics}) {
    if (name == RoleName(role)) return role;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "role \"", name, "\" is not one of admin, submit, view, metrics, worker, coordinator"));
}

absl::StatusOr<Identity> ParseSpiffeId(const std::string& uri) {
  constexpr absl::string_view kScheme = "spiffe://";
  if (!absl::StartsWith(uri, kScheme)) {
    return absl::InvalidArgumentError(
        absl::StrCat("URI SAN \"", uri, "\" is not spiffe://<cluster>/<role>/<name>"));
  }
  std::vector<std::string> parts = absl::StrSplit(uri.substr(kScheme.size()), '/');
  if (parts.size() != 3 || parts[0].empty() || parts[2].empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("URI SAN \"", uri, "\" is not spiffe://<cluster>/<role>/<name>"));
  }
  Identity identity;
  auto role = ParseRole(parts[1]);
  if (!role.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("URI SAN \"", uri, "\": ", role.status().message()));
  }
  identity.role = *role;
  identity.name = parts[2];
  identity.cluster = parts[0];
  identity.source = "certificate";
  return identity;
}

absl::Status CheckCluster(const Identity& identity, const std::string& cluster) {
  if (cluster.empty() || identity.source != "certificate" || identity.cluster == cluster) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "the certificate of ", RoleName(identity.role), " \"", identity.name, "\" is for cluster \"",
      identity.cluster, "\"; this is cluster \"", cluster,
      "\": issue it from this cluster's CA (meshrun certs issue), and give each cluster its own CA"));
}

Role RequiredRole(const std::string& method) {
  static const auto* table = new absl::flat_hash_map<std::string, Role>{
      // Coordinator: calls workers make.
      {"/meshrun.v1.Coordinator/RegisterWorker", Role::kWorker},
      {"/meshrun.v1.Coordinator/Heartbeat", Role::kWorker},
      {"/meshrun.v1.Coordinator/StreamHeartbeats", Role::kWorker},
      {"/meshrun.v1.Coordinator/DeregisterWorker", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueSet", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueGet", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueTryGet", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueList", Role::kWorker},
      {"/meshrun.v1.Coordinator/KeyValueDelete", Role::kWorker},
      {"/meshrun.v1.Coordinator/WaitAtBarrier", Role::kWorker},
      {"/meshrun.v1.Coordinator/UploadTelemetry", Role::kWorker},
      {"/meshrun.v1.Coordinator/RelayTelemetry", Role::kWorker},
      {"/meshrun.v1.Coordinator/ReportJobProgress", Role::kWorker},
      {"/meshrun.v1.Coordinator/ReportCheckpoint", Role::kWorker},
      {"/meshrun.v1.Coordinator/PreemptJob", Role::kWorker},
      // Coordinator: calls people and programs make.
      {"/meshrun.v1.Coordinator/GetSupportedVersions", Role::kAnyAuthenticated},
      {"/meshrun.v1.Coordinator/ListWorkers", Role::kView},
      {"/meshrun.v1.Coordinator/SubmitJob", Role::kSubmit},
      {"/meshrun.v1.Coordinator/UploadProgram", Role::kSubmit},
      {"/meshrun.v1.Coordinator/CancelJob", Role::kSubmit},
      {"/meshrun.v1.Coordinator/CheckpointJob", Role::kSubmit},
      {"/meshrun.v1.Coordinator/GetJob", Role::kView},
      {"/meshrun.v1.Coordinator/ListJobs", Role::kView},
      {"/meshrun.v1.Coordinator/WatchTelemetry", Role::kView},
      {"/meshrun.v1.Coordinator/WatchTelemetryBatches", Role::kView},
      {"/meshrun.v1.Coordinator/GetMetrics", Role::kView},
      {"/meshrun.v1.Coordinator/GetDeviceMemory", Role::kView},
      {"/meshrun.v1.Coordinator/DrainWorker", Role::kAdmin},
      // Worker: the coordinator, but for FetchMemoryCheckpoint and RelayTelemetry.
      {"/meshrun.v1.Worker/GetSupportedVersions", Role::kCoordinator},
      {"/meshrun.v1.Worker/LoadExecutable", Role::kCoordinator},
      {"/meshrun.v1.Worker/CompileProgram", Role::kCoordinator},
      {"/meshrun.v1.Worker/StartJob", Role::kCoordinator},
      {"/meshrun.v1.Worker/StopJob", Role::kCoordinator},
      {"/meshrun.v1.Worker/GetStatus", Role::kCoordinator},
      {"/meshrun.v1.Worker/GetDeviceMemory", Role::kCoordinator},
      {"/meshrun.v1.Worker/CheckpointNow", Role::kCoordinator},
      {"/meshrun.v1.Worker/Drain", Role::kCoordinator},
      // A restarted job's host fetching its state from a host of the ended run (any worker of
      // the cluster may read what any can read from a job's checkpoint directory).
      {"/meshrun.v1.Worker/FetchMemoryCheckpoint", Role::kWorker},
      // A host of a telemetry relay's group uploading through it (docs/scale.md).
      {"/meshrun.v1.Worker/RelayTelemetry", Role::kWorker},
      // gRPC's own services.
      {"/grpc.health.v1.Health/Check", Role::kAnyAuthenticated},
      {"/grpc.health.v1.Health/Watch", Role::kAnyAuthenticated},
  };
  if (auto it = table->find(method); it != table->end()) return it->second;
  if (absl::StartsWith(method, "/grpc.reflection.")) return Role::kView;
  return Role::kAdmin;
}

namespace {
int UserRank(Role role) {
  switch (role) {
    case Role::kView: return 1;
    case Role::kSubmit: return 2;
    case Role::kAdmin: return 3;
    default: return 0;
  }
}
}  // namespace

absl::Status Authorize(const std::string& method, const std::optional<Identity>& identity) {
  if (!identity.has_value()) {
    return absl::UnauthenticatedError(absl::StrCat(
        method, " needs a client certificate from the cluster CA or a bearer token (--token)"));
  }
  const Role need = RequiredRole(method);
  bool ok = false;
  switch (need) {
    case Role::kAnyAuthenticated: ok = true; break;
    case Role::kWorker:
    case Role::kCoordinator: ok = identity->role == need; break;
    default: ok = UserRank(identity->role) >= UserRank(need); break;
  }
  if (ok) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(method, " needs role ", RoleName(need), "; ",
                                                  identity->source, " identity \"",
                                                  identity->name, "\" has role ",
                                                  RoleName(identity->role)));
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

absl::StatusOr<std::vector<TokenStore::Entry>> TokenStore::Parse(const std::string& text) {
  std::vector<Entry> entries;
  int line_number = 0;
  for (absl::string_view raw : absl::StrSplit(text, '\n')) {
    ++line_number;
    std::string line(raw.substr(0, raw.find('#')));
    std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (fields.empty()) continue;
    const auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tokens file line ", line_number, ": ", why,
          "; expected \"<sha256 hex of the token> <admin|submit|view|metrics> <name>\" (meshrun certs "
          "token prints one)"));
    };
    if (fields.size() != 3) return bad("needs 3 fields");
    std::string hash = absl::AsciiStrToLower(fields[0]);
    if (hash.size() != 64 || hash.find_first_not_of("0123456789abcdef") != std::string::npos) {
      return bad("the first field is not 64 hex digits");
    }
    auto role = ParseRole(fields[1]);
    if (!role.ok()) return bad(std::string(role.status().message()));
    entries.push_back({hash, {*role, fields[2], "token"}});
  }
  return entries;
}

absl::StatusOr<std::unique_ptr<TokenStore>> TokenStore::Create(const std::string& path,
                                                               absl::Duration recheck) {
  std::unique_ptr<TokenStore> store(new TokenStore(path, recheck));
  absl::MutexLock l(&store->mu_);
  if (absl::Status s = store->Reload(); !s.ok()) return s;
  store->last_check_ = absl::Now();
  return store;
}

absl::Status TokenStore::Reload() {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat("--auth_tokens_file=", path_, ": cannot read it"));
  }
  const int64_t mtime = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  if (mtime == mtime_ns_ && st.st_size == size_) return absl::OkStatus();
  // This version is read once, parsed or not: a broken file is reported once per change.
  mtime_ns_ = mtime;
  size_ = st.st_size;
  std::ifstream in(path_);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("--auth_tokens_file=", path_, ": cannot read it"));
  }
  std::stringstream text;
  text << in.rdbuf();
  auto entries = Parse(text.str());
  if (!entries.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens_file=", path_, ": ", entries.status().message()));
  }
  entries_ = *std::move(entries);
  spdlog::info("auth tokens: {} loaded from {}", entries_.size(), path_);
  return absl::OkStatus();
}

void TokenStore::RecheckLocked() {
  const absl::Time now = absl::Now();
  if (now - last_check_ < recheck_) return;
  last_check_ = now;
  absl::Status s = Reload();
  if (absl::IsNotFound(s)) {
    // Fail closed: a deleted tokens file revokes every token (an operator removing it means
    // "no more tokens"), until a readable file is back.
    if (!missing_) {
      spdlog::error("auth tokens: {}; every token is revoked until the file is back",
                    std::string(s.message()));
    }
    missing_ = true;
    entries_.clear();
    mtime_ns_ = -1;
    size_ = -1;
    return;
  }
  if (missing_ && s.ok()) spdlog::info("auth tokens: {} is back", path_);
  missing_ = false;
  if (!s.ok()) {
    spdlog::warn("auth tokens: the file no longer parses, keeping the last good table of {} "
                 "tokens: {}",
                 entries_.size(), std::string(s.message()));
  }
}

std::optional<Identity> TokenStore::Lookup(const std::string& token) {
  const std::string hash = Sha256Hex(token);
  absl::MutexLock l(&mu_);
  RecheckLocked();
  std::optional<Identity> found;
  for (const Entry& entry : entries_) {  // no early exit: time does not depend on the match
    if (ConstantTimeEquals(entry.sha256_hex, hash)) found = entry.identity;
  }
  return found;
}

TokenRecheck::TokenRecheck(std::shared_ptr<TokenStore> tokens, std::string token,
                           std::string method, absl::Duration every)
    : tokens_(std::move(tokens)),
      token_(std::move(token)),
      method_(std::move(method)),
      every_(every) {}

TokenRecheck::TokenRecheck(TokenRecheck&& other) noexcept
    : tokens_(std::move(other.tokens_)),
      token_(std::move(other.token_)),
      method_(std::move(other.method_)),
      every_(other.every_) {}

TokenRecheck& TokenRecheck::operator=(TokenRecheck&& other) noexcept {
  tokens_ = std::move(other.tokens_);
  token_ = std::move(other.token_);
  method_ = std::move(other.method_);
  every_ = other.every_;
  absl::MutexLock l(&mu_);
  checked_ = absl::InfinitePast();
  last_ = absl::OkStatus();
  return *this;
}

absl::Status TokenRecheck::Check() {
  if (tokens_ == nullptr) return absl::OkStatus();
  absl::MutexLock l(&mu_);
  const absl::Time now = absl::Now();
  if (now - checked_ < every_) return last_;
  checked_ = now;
  std::optional<Identity> identity = tokens_->Lookup(token_);
  if (!identity.has_value()) {
    last_ = absl::UnauthenticatedError(absl::StrCat(
        "the bearer token that opened this stream is no longer in --auth_tokens_file=",
        tokens_->path(), " (revoked); sign in again with a current token"));
  } else {
    last_ = Authorize(method_, identity);
  }
  return last_;
}

}  // namespace meshrun::services
