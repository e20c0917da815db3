// The security flags every meshrun binary takes (--tls_cert, --tls_key, --tls_ca,
// --tls_refresh_seconds, --insecure, --auth_tokens_file, --token, --token_file; env
// MESHRUN_TOKEN), read once at start-up into the process-wide SecurityConfig
// (rpc/tls_credentials.h). Called by InitBinary.
#pragma once

#include "absl/status/status.h"

namespace meshrun::services {

// Errors: INVALID_ARGUMENT naming the flag and the fix.
absl::Status ApplySecurityFlags(bool is_server);

}  // namespace meshrun::services
