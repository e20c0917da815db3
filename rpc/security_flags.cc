#include "rpc/security_flags.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "rpc/tls_credentials.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this process (meshrun certs issue); with --tls_key and --tls_ca "
          "every gRPC link is mutual TLS. Re-read every --tls_refresh_seconds");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM cluster CA (meshrun certs init): peers must be signed by it");
ABSL_FLAG(int, tls_refresh_seconds, 10, "how often the TLS files are re-read (rotation)");
ABSL_FLAG(bool, insecure, false,
          "servers: allow plaintext on a non-loopback address (no TLS, no access control)");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "coordinator: file of \"<sha256 of token> <admin|submit|view> <name>\" lines granting "
          "roles to bearer tokens; re-read when it changes");
ABSL_FLAG(std::string, token, "", "clients: bearer token sent to the coordinator (needs --tls_ca); "
          "default $MESHRUN_TOKEN");
ABSL_FLAG(std::string, token_file, "", "clients: read the bearer token from this file");

namespace meshrun::services {

absl::Status ApplySecurityFlags(bool is_server) {
  SecurityConfig config;
  config.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  config.tls_key = absl::GetFlag(FLAGS_tls_key);
  config.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  const int refresh = absl::GetFlag(FLAGS_tls_refresh_seconds);
  if (refresh < 1) return absl::InvalidArgumentError("--tls_refresh_seconds must be at least 1");
  config.tls_refresh_seconds = static_cast<unsigned>(refresh);
  config.insecure = absl::GetFlag(FLAGS_insecure);
  config.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  config.token = absl::GetFlag(FLAGS_token);
  if (const std::string file = absl::GetFlag(FLAGS_token_file); !file.empty()) {
    std::ifstream in(file);
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat("--token_file=", file, ": cannot read it"));
    }
    std::stringstream text;
    text << in.rdbuf();
    config.token = std::string(absl::StripAsciiWhitespace(text.str()));
  }
  // The environment's token is used only with TLS (a shell may export it for every command).
  if (const char* env = std::getenv("MESHRUN_TOKEN");
      config.token.empty() && env != nullptr && !config.tls_ca.empty()) {
    config.token = env;
  }
  if (absl::Status s = ValidateSecurityConfig(config, is_server); !s.ok()) return s;
  SetProcessSecurity(std::move(config));
  return absl::OkStatus();
}

}  // namespace meshrun::services
