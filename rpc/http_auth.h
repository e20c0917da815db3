// The HTTP port under the same rules as gRPC (docs/security.md):
//   - with --tls_cert/--tls_key it is HTTPS with the same files (re-read when they change, at
//     the next handshake), asking for a client certificate from --tls_ca (optional: token-only
//     callers connect too; an untrusted or expired one fails the handshake); without them,
//     binding a non-loopback address needs --insecure;
//   - with TLS or --auth_tokens_file, every request needs an identity of role view or more: a
//     client certificate, "Authorization: Bearer <token>", or the cookie meshrun_token that
//     POST /login (form field token; GET /login is the form) sets for the page. /metrics also
//     takes a scrape token of role metrics. 401 without a known identity (a browser asking for
//     HTML is sent to /login instead), 403 for a known one without the role; every refusal is
//     logged with the peer address.
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"

namespace httplib {
class Server;
}

namespace meshrun::services {

// An httplib::SSLServer on the process's TLS files when TLS is configured, else a plain server.
// Check is_valid() before use.
std::unique_ptr<httplib::Server> MakeHttplibServer();

// Errors: FAILED_PRECONDITION (plaintext non-loopback without --insecure), NOT_FOUND /
// INVALID_ARGUMENT (tokens file).
absl::Status InstallHttpAccessControl(httplib::Server& http, const std::string& host);

}  // namespace meshrun::services
