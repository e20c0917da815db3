#include "services/http_auth.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <sys/stat.h>

#include <memory>
#include <mutex>

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

// The HTTPS certificate, re-read from the files when their modification time changes.
class ReloadingCertificate {
 public:
  ReloadingCertificate(std::string cert, std::string key) : cert_(cert), key_(key) {}

  // OpenSSL's certificate callback: sets the current certificate and key on `ssl`.
  static int Callback(SSL* ssl, void* self) {
    return static_cast<ReloadingCertificate*>(self)->Use(ssl) ? 1 : 0;
  }

 private:
  static int64_t MTime(const std::string& path) {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return -1;
    return int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  }
  bool Use(SSL* ssl) {
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t stamp = MTime(cert_) ^ (MTime(key_) << 1);
    if (stamp != stamp_ || x509_ == nullptr) {
      FILE* c = std::fopen(cert_.c_str(), "r");
      FILE* k = std::fopen(key_.c_str(), "r");
      X509* x509 = c ? PEM_read_X509(c, nullptr, nullptr, nullptr) : nullptr;
      EVP_PKEY* pkey = k ? PEM_read_PrivateKey(k, nullptr, nullptr, nullptr) : nullptr;
      if (c) std::fclose(c);
      if (k) std::fclose(k);
      if (x509 != nullptr && pkey != nullptr && X509_check_private_key(x509, pkey) == 1) {
        X509_free(x509_);
        EVP_PKEY_free(pkey_);
        x509_ = x509;
        pkey_ = pkey;
        stamp_ = stamp;
      } else {
        X509_free(x509);
        EVP_PKEY_free(pkey);
        spdlog::warn("HTTPS: cannot load {} / {}; keeping the previous certificate", cert_, key_);
      }
    }
    return x509_ != nullptr && SSL_use_certificate(ssl, x509_) == 1 &&
           SSL_use_PrivateKey(ssl, pkey_) == 1;
  }

  const std::string cert_, key_;
  std::mutex mu_;
  int64_t stamp_ = 0;
  X509* x509_ = nullptr;
  EVP_PKEY* pkey_ = nullptr;
};

}  // namespace

std::unique_ptr<httplib::Server> MakeHttplibServer() {
  const SecurityConfig& security = ProcessSecurity();
  if (!TlsEnabled(security)) return std::make_unique<httplib::Server>();
  // Lives as long as the process: the SSL context may call it until the server is gone.
  auto* certificate = new ReloadingCertificate(security.tls_cert, security.tls_key);
  return std::make_unique<httplib::SSLServer>([certificate](SSL_CTX& ctx) {
    SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
    SSL_CTX_set_cert_cb(&ctx, &ReloadingCertificate::Callback, certificate);
    return true;
  });
}

absl::Status InstallHttpAccessControl(httplib::Server& http, const std::string& host) {
  const SecurityConfig& security = ProcessSecurity();
  if (!http.is_valid()) return absl::InternalError("--http_listen: the HTTPS server did not start");
  if (absl::Status s = CheckPlaintextBind(security, "http_listen", host); !s.ok()) return s;
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
