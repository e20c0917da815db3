#include "rpc/http_auth.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <memory>
#include <mutex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "rpc/cert_authority.h"
#include "rpc/security_policy.h"
#include "rpc/tls_credentials.h"

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

// The HTTPS certificate, and the CA that client certificates are verified against, re-read
// from the files when their modification time changes.
class ReloadingCertificate {
 public:
  ReloadingCertificate(std::string cert, std::string key, std::string ca)
      : cert_(std::move(cert)), key_(std::move(key)), ca_(std::move(ca)) {}

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
    if (const int64_t ca_stamp = MTime(ca_); ca_stamp != ca_stamp_ || store_ == nullptr) {
      X509_STORE* store = X509_STORE_new();
      if (store != nullptr && X509_STORE_load_locations(store, ca_.c_str(), nullptr) == 1) {
        X509_STORE_free(store_);
        store_ = store;
        ca_stamp_ = ca_stamp;
      } else {
        X509_STORE_free(store);
        spdlog::warn("HTTPS: cannot load the CA {}; keeping the previous one", ca_);
      }
    }
    // Client certificates are asked for and, when presented, must lead to the CA.
    return x509_ != nullptr && store_ != nullptr && SSL_use_certificate(ssl, x509_) == 1 &&
           SSL_use_PrivateKey(ssl, pkey_) == 1 && SSL_set1_verify_cert_store(ssl, store_) == 1;
  }

  const std::string cert_, key_, ca_;
  std::mutex mu_;
  int64_t stamp_ = 0;
  int64_t ca_stamp_ = 0;
  X509_STORE* store_ = nullptr;
  X509* x509_ = nullptr;
  EVP_PKEY* pkey_ = nullptr;
};

}  // namespace

std::unique_ptr<httplib::Server> MakeHttplibServer() {
  const SecurityConfig& security = ProcessSecurity();
  if (!TlsEnabled(security)) return std::make_unique<httplib::Server>();
  // Lives as long as the process: the SSL context may call it until the server is gone.
  auto* certificate =
      new ReloadingCertificate(security.tls_cert, security.tls_key, security.tls_ca);
  return std::make_unique<httplib::SSLServer>([certificate](SSL_CTX& ctx) {
    SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
    SSL_CTX_set_cert_cb(&ctx, &ReloadingCertificate::Callback, certificate);
    SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER, nullptr);  // optional: token-only callers too
    return true;
  });
}

namespace {

// The identity in a verified client certificate: its spiffe:// URI SAN (or spiffe-shaped CN).
std::optional<Identity> CertificateIdentity(const httplib::Request& request) {
  if (request.ssl == nullptr) return std::nullopt;
  SSL* ssl = const_cast<SSL*>(request.ssl);
  X509* cert = SSL_get1_peer_certificate(ssl);
  if (cert == nullptr) return std::nullopt;
  std::vector<std::string> candidates;
  if (SSL_get_verify_result(ssl) == X509_V_OK) candidates = SpiffeCandidates(cert);
  X509_free(cert);
  for (const std::string& candidate : candidates) {
    absl::StatusOr<Identity> identity = ParseSpiffeId(candidate);
    if (!identity.ok()) continue;
    if (absl::Status cluster = CheckCluster(*identity, ProcessCluster()); !cluster.ok()) {
      spdlog::warn("dashboard: refused a client certificate: {}", cluster.ToString());
      return std::nullopt;
    }
    return *identity;
  }
  return std::nullopt;
}

constexpr char kLoginPage[] = R"(<!doctype html>
<html><head><meta charset="utf-8"><title>meshrun: sign in</title></head>
<body style="font-family: sans-serif; max-width: 32em; margin: 4em auto">
<h1>meshrun</h1>
<p>%MESSAGE%</p>
<form method="post" action="/login">
<label>Token <input type="password" name="token" autofocus size="40"></label>
<button type="submit">Sign in</button>
</form>
<p><small>A token of role view, submit or admin: <code>meshrun certs token</code>.</small></p>
</body></html>
)";

std::string LoginPage(const std::string& message) {
  std::string page = kLoginPage;
  page.replace(page.find("%MESSAGE%"), 9, message);
  return page;
}

}  // namespace

absl::Status InstallHttpAccessControl(httplib::Server& http, const std::string& host) {
  const SecurityConfig& security = ProcessSecurity();
  if (!http.is_valid()) return absl::InternalError("--http_listen: the HTTPS server did not start");
  if (absl::Status s = CheckPlaintextBind(security, "http_listen", host); !s.ok()) return s;
  const bool tls = TlsEnabled(security);
  if (security.auth_tokens_file.empty() && !tls) return absl::OkStatus();
  std::shared_ptr<TokenStore> tokens;
  if (!security.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenStore>> created =
        TokenStore::Create(security.auth_tokens_file, absl::Seconds(1));
    if (!created.ok()) return created.status();
    tokens = *std::move(created);
  }
  // Every HTTP endpoint reads (dashboard, /metrics, /api/*): role view or more; /metrics also
  // takes a scrape token (role metrics).
  const auto allowed = [](const std::string& path, const Identity& identity) {
    return Authorize("/meshrun.v1.Coordinator/ListJobs", identity).ok() ||
           (path == "/metrics" && identity.role == Role::kMetrics);
  };
  const auto lookup = [tokens](const std::string& token) -> std::optional<Identity> {
    if (token.empty() || tokens == nullptr) return std::nullopt;
    return tokens->Lookup(token);
  };
  // The page's login: POST /login with token=<token> sets the cookie meshrun_token.
  http.Get("/login", [](const httplib::Request&, httplib::Response& response) {
    response.set_content(LoginPage("Sign in with a token."), "text/html");
  });
  http.Post("/login", [lookup, tls](const httplib::Request& request, httplib::Response& response) {
    const std::string token = request.get_param_value("token");
    std::optional<Identity> identity = lookup(token);
    if (!identity.has_value() || !Authorize("/meshrun.v1.Coordinator/ListJobs", identity).ok()) {
      spdlog::warn("refused HTTP login from {}: {}", request.remote_addr,
                   identity.has_value() ? "role " + RoleName(identity->role) + " cannot view"
                                        : "unknown or revoked token");
      response.status = 401;
      response.set_content(LoginPage("That token is unknown, revoked, or cannot view."),
                           "text/html");
      return;
    }
    spdlog::info("HTTP login of token \"{}\" from {}", identity->name, request.remote_addr);
    response.status = 303;
    response.set_header("Location", "/");
    response.set_header("Set-Cookie", absl::StrCat("meshrun_token=", token,
                                                   "; Path=/; HttpOnly; SameSite=Strict",
                                                   tls ? "; Secure" : ""));
  });
  http.Post("/logout", [](const httplib::Request&, httplib::Response& response) {
    response.status = 303;
    response.set_header("Location", "/login");
    response.set_header("Set-Cookie", "meshrun_token=; Path=/; Max-Age=0; HttpOnly");
  });
  http.set_pre_routing_handler([allowed, lookup](const httplib::Request& request,
                                                 httplib::Response& response) {
    if (request.path == "/login" || request.path == "/logout") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    std::optional<Identity> identity = CertificateIdentity(request);
    const std::string token = identity.has_value() ? "" : BearerToken(request);
    if (!identity.has_value()) identity = lookup(token);
    if (identity.has_value() && allowed(request.path, *identity)) {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    const std::string why =
        identity.has_value()
            ? absl::StrCat(identity->source, " identity \"", identity->name, "\" has role ",
                           RoleName(identity->role), "; ", request.path, " needs role view",
                           request.path == "/metrics" ? " or metrics" : "")
            : token.empty() ? "no client certificate or bearer token" : "unknown or revoked token";
    spdlog::warn("refused HTTP {} {} from {}: {}", request.method, request.path,
                 request.remote_addr, why);
    if (!identity.has_value() &&
        request.get_header_value("Accept").find("text/html") != std::string::npos) {
      response.status = 303;  // a browser: to the login page
      response.set_header("Location", "/login");
      return httplib::Server::HandlerResponse::Handled;
    }
    response.status = identity.has_value() ? 403 : 401;
    if (!identity.has_value()) response.set_header("WWW-Authenticate", "Bearer");
    response.set_content(absl::StrCat(identity.has_value() ? "PERMISSION_DENIED: "
                                                           : "UNAUTHENTICATED: ",
                                      why, "\n"),
                         "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  return absl::OkStatus();
}

}  // namespace meshrun::services
