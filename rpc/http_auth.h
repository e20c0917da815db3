// The HTTP port under the same rules as gRPC (docs/security.md):
//   - with --tls_cert/--tls_key it is HTTPS with the same files (re-read when they change, at
//     the next handshake), asking for a client certificate from --tls_ca (optional: token-only
//     callers connect too; an untrusted or expired one fails the handshake); without them,
//     binding a non-loopback address needs --insecure;
//   - with TLS or --auth_tokens_file, every request needs an identity of role view or more: a
//     client certificate, "Authorization: Bearer <token>", or the cookie meshrun_token (exactly
//     that name) that POST /login sets for the page (the token in the form body only; GET
//     /login is the form). A POST /login must come from the dashboard's own origin (Origin, or
//     lacking it Referer), so another site cannot sign a browser in (login CSRF). /metrics also
//     takes a scrape token of role metrics. 401 without a known identity (a browser asking for
//     HTML is sent to /login instead), 403 for a known one without the role; every refusal is
//     logged with the peer address;
//   - in plaintext on a loopback address, a request whose Host is not a loopback name or
//     address is refused (421), so a web page cannot reach the dashboard through DNS rebinding.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "rpc/security_policy.h"

namespace httplib {
class Server;
struct Request;
}  // namespace httplib
typedef struct ssl_ctx_st SSL_CTX;

namespace meshrun::services {

// The HTTPS context on the process's TLS files (certificate, key and client CA re-read when
// they change), or null when TLS is not configured.
// Errors: INTERNAL (OpenSSL could not make a context).
absl::StatusOr<std::shared_ptr<SSL_CTX>> MakeHttpsContext();

// The security headers every answer carries: nosniff, a Content-Security-Policy the dashboard
// (web/) satisfies (its own scripts, styles, fetches and event streams only; no framing), no
// framing, no referrer, and HSTS under TLS.
void InstallSecurityHeaders(httplib::Server& http, bool tls);

// Installs the checks above on `http` (a pre-routing handler, /login and /logout) for the port
// bound on `host`.
//
// Lifetime: `http` calls into the returned object; it must outlive serving.
// Thread-safety: every method is safe from the server's threads.
class HttpAccessControl {
 public:
  // Errors: FAILED_PRECONDITION (plaintext non-loopback without --insecure), NOT_FOUND /
  // INVALID_ARGUMENT (tokens file), INTERNAL (the HTTPS server is not valid).
  static absl::StatusOr<std::unique_ptr<HttpAccessControl>> Install(httplib::Server& http,
                                                                     const std::string& host);

  // The caller's identity (client certificate, else bearer token or login cookie); nullopt
  // when there is none, or when no policy is on.
  std::optional<Identity> Identify(const httplib::Request& request) const;
  // For a stream `request` opens: re-checks the token that authorised it (always OK for a
  // certificate, or with no policy).
  TokenRecheck Recheck(const httplib::Request& request) const;

 private:
  HttpAccessControl() = default;
  void InstallHandlers(httplib::Server& http);

  bool tls_ = false;
  bool enforcing_ = false;       // TLS or a tokens file
  bool check_host_ = false;      // plaintext on loopback: refuse foreign Host values
  std::shared_ptr<TokenStore> tokens_;
};

}  // namespace meshrun::services
