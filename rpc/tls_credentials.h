// gRPC credentials for every meshrun link, built in one place: mutual TLS from PEM files that
// gRPC's FileWatcherCertificateProvider re-reads (a rotated certificate is used by new
// connections without a restart), bearer tokens, and the adapter that feeds the peer's
// certificate identity and token to the access policy of rpc/security_policy.h.
//
// The binaries fill a SecurityConfig from their flags (rpc/security_flags.cc) and install
// it process-wide; MakeChannel and StartGrpcServer (rpc/server_support.h) use it, so the
// coordinator's worker channels, the worker's coordinator channel and the CLI all follow it.
// Without TLS, servers may bind loopback only unless `insecure` is set.
//
// Thread-safety: SetProcessSecurity once at start-up, before any channel or server exists;
// everything else is safe from any thread.
#pragma once

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rpc/security_policy.h"

namespace meshrun::services {

struct SecurityConfig {
  std::string tls_cert;  // PEM certificate chain of this process
  std::string tls_key;   // PEM private key
  std::string tls_ca;    // PEM cluster CA: peers must present certificates it signed
  unsigned tls_refresh_seconds = 10;  // how often the certificate files are re-read
  bool insecure = false;              // allow plaintext on a non-loopback address
  std::string auth_tokens_file;       // servers: hashed bearer tokens (see TokenStore)
  std::string token;                  // clients: bearer token sent on every call
};

bool TlsEnabled(const SecurityConfig& config);

// Errors: INVALID_ARGUMENT naming the flag that is missing or unreadable.
absl::Status ValidateSecurityConfig(const SecurityConfig& config, bool is_server);

// Also reads the cluster of the process's own certificate (ProcessCluster).
void SetProcessSecurity(SecurityConfig config);
const SecurityConfig& ProcessSecurity();

// The <cluster> of this process's own certificate (spiffe://<cluster>/...), as of the last
// SetProcessSecurity; empty without one. Peers' certificates must name the same cluster.
std::string ProcessCluster();

// "127.0.0.1:<port>" without TLS, "[::]:<port>" with it.
std::string DefaultListenAddress(int port);

// "localhost", 127.0.0.0/8 or ::1 (an address or name as written, without brackets or port).
bool IsLoopback(const std::string& host);

// OK when `host` may be bound under `config`: anything with TLS; loopback in plaintext; other
// addresses in plaintext only with `insecure` (then a warning is logged).
// Errors: FAILED_PRECONDITION naming the address and the two ways out.
absl::Status CheckPlaintextBind(const SecurityConfig& config, const std::string& flag,
                                const std::string& host);

// True when this process serves plaintext on a non-loopback address (set by CheckPlaintextBind).
bool ServingInsecurely();
void MarkServingInsecurely();

// Server credentials: TLS (client certificates requested and verified when presented) with the
// access policy, or insecure credentials without TLS. Errors: INVALID_ARGUMENT (bad tokens file).
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeServerCredentials(
    const SecurityConfig& config);

// Who a client expects at the other end of a channel: with TLS, the server's certificate must
// name this role (and `name`, when not empty) in its spiffe:// identity, or the handshake fails
// before anything (a token included) is sent, with an error naming the expected and the
// presented identity. CLI, SDK and workers expect the coordinator; the coordinator expects
// worker/<host> of the host it calls.
struct ExpectedServer {
  Role role = Role::kCoordinator;
  std::string name;  // empty: any name of that role
};
std::string DescribeExpected(const ExpectedServer& expect);

// Channel credentials: TLS verifying the server against the CA (no host-name check: cluster
// members are addressed by IP as often as by name) and, when `expect` is given, its identity;
// the own certificate when given, and the bearer token when given; insecure credentials
// without TLS.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(
    const SecurityConfig& config, const std::optional<ExpectedServer>& expect = std::nullopt);

// The caller's identity as the access policy established it: from its certificate, else its
// bearer token (looked up again in this process's tokens file), with its address; nullopt
// without TLS.
std::optional<Identity> PeerIdentity(const grpc::ServerContextBase& context);

// For a long call (a watch stream): re-checks, while it runs, that the bearer token that
// authorised it is still in this process's tokens file (TokenRecheck::Check, to call at each
// write). A certificate caller, or one without a token, gets a recheck that always passes.
TokenRecheck RecheckCaller(const grpc::ServerContextBase& context, const std::string& method);

// OK unless TLS is on and the caller is a worker whose certificate names another host.
// Errors: PERMISSION_DENIED naming both host names.
absl::Status CheckWorkerHost(const grpc::ServerContextBase& context, const std::string& host);

}  // namespace meshrun::services
