#include "services/http_auth.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <memory>

#include "absl/strings/match.h"
#include "services/security_policy.h"
#include "services/tls_credentials.h"

namespace meshrun::services {
namespace {

std::string BearerToken(const httplib::Request& request) {
  const std::string header = request.get_header_value("Authorization");
  if (absl::StartsWith(header, "Bearer ")) return header.substr(7);
  const std::string cookies = request.get_header_value("Cookie");
  const std::string kCookie = "meshrun_token=";
  if (size_t at = cookies.find(kCookie); at != std::string::npos) {
    const size_t start = at + kCookie.size();
    return cookies.substr(start, cookies.find(';', start) - start);
  }
  return "";
}

}  // namespace

absl::Status InstallHttpAccessControl(httplib::Server& http, const std::string& host) {
  const SecurityConfig& security = ProcessSecurity();
  if (absl::Status s = CheckPlaintextBind({.insecure = security.insecure}, "http_listen", host);
      !s.ok()) {
    return s;
  }
  if (security.auth_tokens_file.empty()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<TokenStore>> created =
      TokenStore::Create(security.auth_tokens_file, absl::Seconds(1));
  if (!created.ok()) return created.status();
  std::shared_ptr<TokenStore> tokens = *std::move(created);
  http.set_pre_routing_handler([tokens](const httplib::Request& request,
                                        httplib::Response& response) {
    const std::string token = BearerToken(request);
    std::optional<Identity> identity;
    if (!token.empty()) identity = tokens->Lookup(token);
    // Every HTTP endpoint reads (dashboard, /metrics, /api/*): role view.
    absl::Status status = Authorize("/meshrun.v1.Coordinator/ListJobs", identity);
    if (status.ok()) return httplib::Server::HandlerResponse::Unhandled;
    const bool unauthenticated = identity == std::nullopt;
    spdlog::warn("refused HTTP {} {} from {}: {}", request.method, request.path,
                 request.remote_addr,
                 unauthenticated ? (token.empty() ? "no bearer token" : "unknown token")
                                 : std::string(status.message()));
    response.status = 401;
    response.set_header("WWW-Authenticate", "Bearer");
    response.set_content(token.empty() ? "UNAUTHENTICATED: send Authorization: Bearer <token>\n"
                                       : "UNAUTHENTICATED: unknown or revoked token\n",
                         "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  return absl::OkStatus();
}

}  // namespace meshrun::services
