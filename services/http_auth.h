// The HTTP port under the same rules as gRPC (docs/security.md). The HTTP server itself is
// plaintext (Debian's cpp-httplib here is used without its TLS server), so:
//   - binding a non-loopback address needs --insecure, as for plaintext gRPC;
//   - with --auth_tokens_file, every request needs "Authorization: Bearer <token>" (or the
//     cookie meshrun_token=<token> for the page) of role view or more; 401 without one, 403
//     for a token not in the file; every refusal is logged with the peer address.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace httplib {
class Server;
}

namespace meshrun::services {

// Errors: FAILED_PRECONDITION (plaintext non-loopback without --insecure), NOT_FOUND /
// INVALID_ARGUMENT (tokens file).
absl::Status InstallHttpAccessControl(httplib::Server& http, const std::string& host);

}  // namespace meshrun::services
