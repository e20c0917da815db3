// The HTTP port under the same rules as gRPC (docs/security.md):
//   - with --tls_cert/--tls_key it is HTTPS with the same files (re-read when they change, at
//     the next handshake); without them, binding a non-loopback address needs --insecure;
//   - with --auth_tokens_file, every request needs "Authorization: Bearer <token>" (or the
//     cookie meshrun_token=<token> for the page) of role view or more; 401 without one, 403
//     for a token not in the file; every refusal is logged with the peer address.
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
