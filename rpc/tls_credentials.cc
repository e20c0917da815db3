#include "rpc/tls_credentials.h"

#include <arpa/inet.h>
#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_metadata_processor.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "rpc/cert_authority.h"
#include "rpc/refusal_log.h"

namespace meshrun::services {
namespace {

SecurityConfig& ProcessConfig() {
  static auto* config = new SecurityConfig();
  return *config;
}

// The tokens file of this process's (last) server that has one, for PeerIdentity; its
// processor holds the same store.
absl::Mutex tokens_mu;
std::shared_ptr<TokenStore>& ProcessTokens() ABSL_EXCLUSIVE_LOCKS_REQUIRED(tokens_mu) {
  static auto* tokens = new std::shared_ptr<TokenStore>();
  return *tokens;
}

// "Bearer <token>" from a call's metadata; empty without one. `authorization` is set when an
// authorization header was present at all.
template <typename Metadata>
std::string BearerToken(const Metadata& metadata, bool* authorization = nullptr) {
  for (const auto& [key, value] : metadata) {
    if (key != "authorization") continue;
    if (authorization != nullptr) *authorization = true;
    const std::string v(value.data(), value.size());
    if (absl::StartsWith(v, "Bearer ")) return v.substr(7);
  }
  return "";
}
std::atomic<bool> serving_insecurely{false};

// The cluster in `config`'s own certificate; empty without one (or when it names none: then
// peers' clusters go unchecked, and the log says so).
std::string OwnCluster(const SecurityConfig& config) {
  if (config.tls_cert.empty()) return "";
  absl::StatusOr<Identity> own = ReadCertificateIdentity(config.tls_cert);
  if (own.ok()) return own->cluster;
  spdlog::warn("--tls_cert: {}; peers' cluster names are not checked", own.status().ToString());
  return "";
}

absl::Mutex cluster_mu;
std::string& ProcessClusterName() ABSL_EXCLUSIVE_LOCKS_REQUIRED(cluster_mu) {
  static auto* cluster = new std::string();
  return *cluster;
}

std::string Property(const grpc::AuthContext& context, const char* name) {
  std::vector<grpc::string_ref> values = context.FindPropertyValues(name);
  if (values.empty()) return "";
  return std::string(values.front().data(), values.front().size());
}

std::string Describe(const grpc::AuthContext& context) {
  std::vector<std::string> what;
  for (const char* name : {GRPC_PEER_SPIFFE_ID_PROPERTY_NAME, GRPC_X509_SUBJECT_PROPERTY_NAME}) {
    if (std::string v = Property(context, name); !v.empty()) what.push_back(v);
  }
  return what.empty() ? "no client certificate" : absl::StrJoin(what, " ");
}

// The certificate's identity: its spiffe:// URI SAN (gRPC sets peer_spiffe_id when there is
// exactly one), else any spiffe:// URI SAN, else the common name when it is spiffe-shaped.
std::optional<Identity> CertificateIdentity(const grpc::AuthContext& context,
                                            std::string* problem) {
  std::vector<std::string> candidates;
  for (const char* name : {GRPC_PEER_SPIFFE_ID_PROPERTY_NAME, GRPC_PEER_URI_PROPERTY_NAME,
                           GRPC_X509_CN_PROPERTY_NAME}) {
    for (const grpc::string_ref& v : context.FindPropertyValues(name)) {
      candidates.emplace_back(v.data(), v.size());
    }
  }
  for (const std::string& candidate : candidates) {
    if (!absl::StartsWith(candidate, "spiffe://")) continue;
    absl::StatusOr<Identity> identity = ParseSpiffeId(candidate);
    if (!identity.ok()) {
      *problem = std::string(identity.status().message());
      continue;
    }
    if (absl::Status cluster = CheckCluster(*identity, ProcessCluster()); !cluster.ok()) {
      *problem = std::string(cluster.message());
      return std::nullopt;
    }
    return *identity;
  }
  return std::nullopt;
}

// gRPC runs this for every call on a TLS server, before the handler: it maps the peer's
// certificate (or bearer token) to an identity and asks the policy. It records nothing in the
// auth context: gRPC 1.51 hands every call of a connection the connection's own context, so
// adding properties per call raced (heap corruption under concurrent calls) and grew without
// bound. Handlers derive the same identity again (PeerIdentity); the authorization header is
// left in the metadata for that.
class AccessPolicyProcessor : public grpc::AuthMetadataProcessor {
 public:
  explicit AccessPolicyProcessor(std::shared_ptr<TokenStore> tokens) : tokens_(std::move(tokens)) {}

  grpc::Status Process(const InputMetadata& metadata, grpc::AuthContext* context,
                       OutputMetadata* /*consumed*/, OutputMetadata* /*response*/) override {
    std::string method;
    for (const auto& [key, value] : metadata) {
      if (key == ":path") method.assign(value.data(), value.size());
    }
    bool had_authorization = false;
    const std::string bearer = BearerToken(metadata, &had_authorization);
    std::string problem;
    std::optional<Identity> identity = CertificateIdentity(*context, &problem);
    if (!identity.has_value() && !bearer.empty() && tokens_ != nullptr) {
      identity = tokens_->Lookup(bearer);
      if (!identity.has_value()) problem = "bearer token not in the tokens file (revoked?)";
    } else if (!identity.has_value() && had_authorization) {
      problem = tokens_ == nullptr ? "this server takes no tokens (no --auth_tokens_file)"
                                   : "authorization header is not \"Bearer <token>\"";
    }
    absl::Status status = Authorize(method, identity);
    if (!status.ok()) {
      std::string message(status.message());
      if (!problem.empty()) absl::StrAppend(&message, " (", problem, ")");
      // gRPC gives this processor the metadata and the connection's auth context, not the
      // peer's address: the log names the certificate (or token) instead. Refusals in the
      // handlers (CheckWorkerHost, job membership) name the address too.
      RefusalLog::Process().RecordCall(
          identity, method, status,
          absl::StrCat("refused ", method, " from ", Describe(*context), ": ", message));
      return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
    }
    return grpc::Status::OK;
  }

 private:
  const std::shared_ptr<TokenStore> tokens_;
};

class BearerTokenPlugin : public grpc::MetadataCredentialsPlugin {
 public:
  explicit BearerTokenPlugin(std::string token) : header_("Bearer " + std::move(token)) {}
  bool IsBlocking() const override { return false; }
  grpc::Status GetMetadata(grpc::string_ref, grpc::string_ref, const grpc::AuthContext&,
                           std::multimap<grpc::string, grpc::string>* metadata) override {
    metadata->insert({"authorization", header_});
    return grpc::Status::OK;
  }

 private:
  const std::string header_;
};

// The client's check of the server's identity, after gRPC verified its chain against the CA.
class ServerIdentityVerifier final : public grpc::experimental::ExternalCertificateVerifier {
 public:
  // `cluster`: this client's own (from its certificate); empty: not checked.
  ServerIdentityVerifier(ExpectedServer expect, std::string cluster)
      : expect_(std::move(expect)), cluster_(std::move(cluster)) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)>, grpc::Status* sync_status) override {
    std::vector<std::string> candidates;
    for (const grpc::string_ref& uri : request->uri_names()) {
      candidates.emplace_back(uri.data(), uri.size());
    }
    candidates.emplace_back(request->common_name().data(), request->common_name().size());
    std::string presented;
    for (const std::string& candidate : candidates) {
      if (!absl::StartsWith(candidate, "spiffe://")) continue;
      if (presented.empty()) presented = candidate;
      absl::StatusOr<Identity> identity = ParseSpiffeId(candidate);
      if (identity.ok() && identity->role == expect_.role &&
          (expect_.name.empty() || identity->name == expect_.name) &&
          CheckCluster(*identity, cluster_).ok()) {
        *sync_status = grpc::Status::OK;
        return true;
      }
    }
    const std::string message = absl::StrCat(
        "wrong server identity: expected ", DescribeExpected(expect_),
        cluster_.empty() ? "" : absl::StrCat(" of cluster \"", cluster_, "\""),
        ", the server presented ",
        presented.empty() ? "no spiffe:// identity" : presented,
        " (is the address right? see docs/security.md)");
    spdlog::warn("{}", message);
    *sync_status = grpc::Status(grpc::StatusCode::UNAUTHENTICATED, message);
    return true;
  }
  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {}

 private:
  const ExpectedServer expect_;
  const std::string cluster_;
};

absl::Status Readable(const std::string& flag, const std::string& path) {
  if (access(path.c_str(), R_OK) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": cannot read the file; pass a readable PEM file "
                     "(meshrun certs issue writes them)"));
  }
  return absl::OkStatus();
}

}  // namespace

bool TlsEnabled(const SecurityConfig& config) { return !config.tls_ca.empty(); }

absl::Status ValidateSecurityConfig(const SecurityConfig& config, bool is_server) {
  const bool any = !config.tls_cert.empty() || !config.tls_key.empty() || !config.tls_ca.empty();
  if (!any) {
    if (!config.token.empty()) {
      return absl::InvalidArgumentError(
          "--token needs TLS (--tls_ca at least): a bearer token is never sent in plaintext");
    }
    return absl::OkStatus();
  }
  if (config.tls_ca.empty()) {
    return absl::InvalidArgumentError("--tls_cert/--tls_key need --tls_ca (the cluster CA)");
  }
  if (config.tls_cert.empty() != config.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key go together; pass both");
  }
  if (is_server && config.tls_cert.empty()) {
    return absl::InvalidArgumentError(
        "a server with --tls_ca also needs --tls_cert and --tls_key (meshrun certs issue)");
  }
  if (!config.tls_cert.empty()) {
    if (absl::Status s = Readable("tls_cert", config.tls_cert); !s.ok()) return s;
    if (absl::Status s = Readable("tls_key", config.tls_key); !s.ok()) return s;
  }
  if (!config.auth_tokens_file.empty()) {
    if (absl::Status s = Readable("auth_tokens_file", config.auth_tokens_file); !s.ok()) return s;
  }
  return Readable("tls_ca", config.tls_ca);
}

void SetProcessSecurity(SecurityConfig config) {
  std::string cluster = OwnCluster(config);
  {
    absl::MutexLock l(&cluster_mu);
    ProcessClusterName() = std::move(cluster);
  }
  ProcessConfig() = std::move(config);
}

std::string ProcessCluster() {
  absl::MutexLock l(&cluster_mu);
  return ProcessClusterName();
}
const SecurityConfig& ProcessSecurity() { return ProcessConfig(); }

std::string DefaultListenAddress(int port) {
  return absl::StrCat(TlsEnabled(ProcessSecurity()) ? "[::]" : "127.0.0.1", ":", port);
}

bool IsLoopback(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4;
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6;
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

absl::Status CheckPlaintextBind(const SecurityConfig& config, const std::string& flag,
                                const std::string& host) {
  if (TlsEnabled(config) || IsLoopback(host)) return absl::OkStatus();
  if (!config.insecure) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--", flag, ": serving ", host, " in plaintext would let anyone who reaches it run jobs; "
        "pass --tls_cert/--tls_key/--tls_ca (see docs/security.md), bind 127.0.0.1, or accept "
        "the risk with --insecure"));
  }
  MarkServingInsecurely();
  spdlog::warn("--insecure: serving {} in PLAINTEXT without authentication; anyone who reaches "
               "it can run code on every worker", host);
  return absl::OkStatus();
}

bool ServingInsecurely() { return serving_insecurely.load(); }
void MarkServingInsecurely() { serving_insecurely.store(true); }

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityConfig& config) {
  if (!TlsEnabled(config)) return grpc::InsecureServerCredentials();
  auto provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      config.tls_key, config.tls_cert, config.tls_ca, config.tls_refresh_seconds);
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  std::shared_ptr<TokenStore> tokens;
  if (!config.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenStore>> store =
        TokenStore::Create(config.auth_tokens_file, absl::Seconds(1));
    if (!store.ok()) return store.status();
    tokens = *std::move(store);
  }
  if (tokens != nullptr) {
    absl::MutexLock l(&tokens_mu);
    ProcessTokens() = tokens;
  }
  std::shared_ptr<grpc::ServerCredentials> credentials =
      grpc::experimental::TlsServerCredentials(options);
  credentials->SetAuthMetadataProcessor(
      std::make_shared<AccessPolicyProcessor>(tokens));
  return credentials;
}

std::string DescribeExpected(const ExpectedServer& expect) {
  return absl::StrCat("spiffe://<cluster>/", RoleName(expect.role), "/",
                      expect.name.empty() ? "<any name>" : expect.name);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const SecurityConfig& config, const std::optional<ExpectedServer>& expect) {
  if (!TlsEnabled(config)) return grpc::InsecureChannelCredentials();
  std::shared_ptr<grpc::experimental::FileWatcherCertificateProvider> provider;
  grpc::experimental::TlsChannelCredentialsOptions options;
  if (config.tls_cert.empty()) {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        config.tls_ca, config.tls_refresh_seconds);
  } else {
    provider = std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        config.tls_key, config.tls_cert, config.tls_ca, config.tls_refresh_seconds);
    options.watch_identity_key_cert_pairs();
  }
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  options.set_verify_server_certs(true);  // the chain must lead to --tls_ca
  options.set_check_call_host(false);
  if (expect.has_value()) {
    options.set_certificate_verifier(
        grpc::experimental::ExternalCertificateVerifier::Create<ServerIdentityVerifier>(
            // The process's own certificate was read once (SetProcessSecurity); channels are
            // made per call in places (a /metrics scrape asks every worker).
            *expect, config.tls_cert == ProcessSecurity().tls_cert ? ProcessCluster()
                                                                   : OwnCluster(config)));
  } else {
    options.set_certificate_verifier(std::make_shared<grpc::experimental::NoOpCertificateVerifier>());
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::experimental::TlsCredentials(options);
  if (config.token.empty()) return credentials;
  return grpc::CompositeChannelCredentials(
      credentials, grpc::MetadataCredentialsFromPlugin(
                       std::make_unique<BearerTokenPlugin>(config.token)));
}

std::optional<Identity> PeerIdentity(const grpc::ServerContextBase& context) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return std::nullopt;
  const std::string transport = Property(*auth, GRPC_TRANSPORT_SECURITY_TYPE_PROPERTY_NAME);
  if (transport != GRPC_TLS_TRANSPORT_SECURITY_TYPE &&
      transport != GRPC_SSL_TRANSPORT_SECURITY_TYPE) {
    return std::nullopt;  // plaintext: no identity, as the policy is off
  }
  std::string problem;
  std::optional<Identity> identity = CertificateIdentity(*auth, &problem);
  if (!identity.has_value()) {  // the processor's second source: the bearer token
    const std::string token = BearerToken(context.client_metadata());
    std::shared_ptr<TokenStore> tokens;
    {
      absl::MutexLock l(&tokens_mu);
      tokens = ProcessTokens();
    }
    if (!token.empty() && tokens != nullptr) identity = tokens->Lookup(token);
  }
  if (identity.has_value()) identity->peer = context.peer();
  return identity;
}

TokenRecheck RecheckCaller(const grpc::ServerContextBase& context, const std::string& method) {
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  if (auth == nullptr) return {};
  std::string problem;
  if (CertificateIdentity(*auth, &problem).has_value()) return {};  // not revocable here
  std::string token = BearerToken(context.client_metadata());
  std::shared_ptr<TokenStore> tokens;
  {
    absl::MutexLock l(&tokens_mu);
    tokens = ProcessTokens();
  }
  if (token.empty() || tokens == nullptr) return {};
  return TokenRecheck(std::move(tokens), std::move(token), method);
}

absl::Status CheckWorkerHost(const grpc::ServerContextBase& context, const std::string& host) {
  std::optional<Identity> peer = PeerIdentity(context);
  if (!peer.has_value() || peer->role != Role::kWorker || peer->name == host) {
    return absl::OkStatus();
  }
  RefusalLog::Process().Record(
      CallerName(peer), "permission_denied act_as_another_host",
      absl::StrCat("refused: worker certificate for host \"", peer->name, "\" from ",
                   context.peer(), " tried to act as host \"", host, "\""));
  return absl::PermissionDeniedError(absl::StrCat(
      "this worker's certificate names host \"", peer->name, "\"; it may not act as host \"",
      host, "\""));
}

}  // namespace meshrun::services
