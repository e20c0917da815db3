#include "rpc/http_auth.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <algorithm>
#include <memory>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/str_cat.h"
#include "rpc/cert_authority.h"
#include "rpc/security_policy.h"
#include "rpc/tls_credentials.h"

namespace meshrun::services {
namespace {

// The value of cookie `name` (exactly that name; "xmeshrun_token" is another cookie), or "".
std::string CookieValue(const httplib::Request& request, absl::string_view name) {
  for (size_t i = 0; i < request.get_header_value_count("Cookie"); ++i) {
    const std::string header = request.get_header_value("Cookie", i);
    for (absl::string_view part : absl::StrSplit(header, ';')) {
      const size_t eq = part.find('=');
      if (eq == absl::string_view::npos) continue;
      if (absl::StripAsciiWhitespace(part.substr(0, eq)) != name) continue;
      absl::string_view value = absl::StripAsciiWhitespace(part.substr(eq + 1));
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"') {
        value = value.substr(1, value.size() - 2);
      }
      return std::string(value);
    }
  }
  return "";
}

constexpr char kLoginCookie[] = "meshrun_token";

std::string BearerToken(const httplib::Request& request) {
  const std::string header = request.get_header_value("Authorization");
  if (absl::StartsWith(header, "Bearer ")) return header.substr(7);
  return CookieValue(request, kLoginCookie);
}

// The HTTPS certificate, and the CA that client certificates are verified against, re-read
// from the files when their modification time changes.
class ReloadingCertificate {
 public:
  ReloadingCertificate(std::string cert, std::string key, std::string ca)
      : cert_(std::move(cert)), key_(std::move(key)), ca_(std::move(ca)) {}
  ~ReloadingCertificate() {
    X509_STORE_free(store_);
    X509_free(x509_);
    EVP_PKEY_free(pkey_);
  }

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

absl::StatusOr<std::shared_ptr<SSL_CTX>> MakeHttpsContext() {
  const SecurityConfig& security = ProcessSecurity();
  if (!TlsEnabled(security)) return std::shared_ptr<SSL_CTX>();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return absl::InternalError("--http_listen: OpenSSL cannot make a context");
  auto* certificate =
      new ReloadingCertificate(security.tls_cert, security.tls_key, security.tls_ca);
  SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_cert_cb(ctx, &ReloadingCertificate::Callback, certificate);
  SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, nullptr);  // optional: token-only callers too
  static constexpr unsigned char kSession[] = "meshrun-http";
  SSL_CTX_set_session_id_context(ctx, kSession, sizeof(kSession) - 1);
  return std::shared_ptr<SSL_CTX>(ctx, [certificate](SSL_CTX* c) {
    SSL_CTX_free(c);
    delete certificate;
  });
}

void InstallSecurityHeaders(httplib::Server& http, bool tls) {
  httplib::Headers headers = {
      {"X-Content-Type-Options", "nosniff"},
      {"X-Frame-Options", "DENY"},
      {"Referrer-Policy", "no-referrer"},
      // The dashboard loads app.js and app.css from its own origin, fetches /api and opens
      // the /api/watch event stream there; its icon is a data: URL. Nothing else.
      {"Content-Security-Policy",
       "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"},
  };
  if (tls) headers.emplace("Strict-Transport-Security", "max-age=31536000");
  http.set_default_headers(std::move(headers));
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
<body>
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

// The host part of a Host header value ("127.0.0.1:8080", "[::1]:80", "localhost."), lower
// case, without brackets, port or a trailing dot; empty when malformed.
std::string HostName(const std::string& host) {
  std::string name = absl::AsciiStrToLower(host);
  if (absl::StartsWith(name, "[")) {
    const size_t close = name.find(']');
    if (close == std::string::npos) return "";
    return name.substr(1, close - 1);
  }
  if (std::count(name.begin(), name.end(), ':') > 1) return "";
  name = name.substr(0, name.find(':'));
  if (absl::EndsWith(name, ".")) name.pop_back();
  return name;
}

// A loopback name or address (localhost and *.localhost resolve to loopback in browsers).
bool LoopbackHost(const std::string& host) {
  const std::string name = HostName(host);
  return !name.empty() && (IsLoopback(name) || absl::EndsWith(name, ".localhost"));
}

// The origin a header names: "scheme://host[:port]", lower case (a Referer's path dropped).
std::string OriginOf(const std::string& url) {
  const size_t scheme = url.find("://");
  if (scheme == std::string::npos) return "";
  return absl::AsciiStrToLower(url.substr(0, url.find('/', scheme + 3)));
}

// OK when a state-changing POST comes from the dashboard's own origin: its Origin header, or
// lacking one its Referer, names this scheme and the Host it was sent to.
absl::Status CheckSameOrigin(const httplib::Request& request, bool tls) {
  const std::string own =
      absl::StrCat(tls ? "https://" : "http://",
                   absl::AsciiStrToLower(request.get_header_value("Host")));
  const std::string origin = request.get_header_value("Origin");
  const std::string referer = request.get_header_value("Referer");
  const std::string from = !origin.empty() ? OriginOf(origin) : OriginOf(referer);
  if (origin.empty() && referer.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        request.path, " needs an Origin or Referer header naming ", own,
        " (the dashboard's own sign-in form sends one)"));
  }
  if (from != own) {
    return absl::PermissionDeniedError(absl::StrCat(
        request.path, " from origin \"", !origin.empty() ? origin : referer,
        "\" refused: only the dashboard's own page (", own, ") may post it"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpAccessControl>> HttpAccessControl::Install(
    httplib::Server& http, const std::string& host) {
  const SecurityConfig& security = ProcessSecurity();
  if (!http.is_valid()) return absl::InternalError("--http_listen: the HTTP server is not valid");
  if (absl::Status s = CheckPlaintextBind(security, "http_listen", host); !s.ok()) return s;
  std::unique_ptr<HttpAccessControl> control(new HttpAccessControl());
  control->tls_ = TlsEnabled(security);
  control->enforcing_ = control->tls_ || !security.auth_tokens_file.empty();
  control->check_host_ = !control->tls_ && IsLoopback(host);
  if (!security.auth_tokens_file.empty()) {
    absl::StatusOr<std::unique_ptr<TokenStore>> created =
        TokenStore::Create(security.auth_tokens_file, absl::Seconds(1));
    if (!created.ok()) return created.status();
    control->tokens_ = *std::move(created);
  }
  control->InstallHandlers(http);
  return control;
}

std::optional<Identity> HttpAccessControl::Identify(const httplib::Request& request) const {
  if (!enforcing_) return std::nullopt;
  if (std::optional<Identity> identity = CertificateIdentity(request); identity.has_value()) {
    return identity;
  }
  const std::string token = BearerToken(request);
  if (token.empty() || tokens_ == nullptr) return std::nullopt;
  return tokens_->Lookup(token);
}

TokenRecheck HttpAccessControl::Recheck(const httplib::Request& request) const {
  if (!enforcing_ || tokens_ == nullptr || CertificateIdentity(request).has_value()) return {};
  std::string token = BearerToken(request);
  if (token.empty()) return {};
  return TokenRecheck(tokens_, std::move(token), "/meshrun.v1.Coordinator/ListJobs");
}

void HttpAccessControl::InstallHandlers(httplib::Server& http) {
  // Every HTTP endpoint reads (dashboard, /metrics, /api/*): role view or more; /metrics also
  // takes a scrape token (role metrics).
  const auto allowed = [](const std::string& path, const Identity& identity) {
    return Authorize("/meshrun.v1.Coordinator/ListJobs", identity).ok() ||
           (path == "/metrics" && identity.role == Role::kMetrics);
  };
  const bool tls = tls_;
  if (enforcing_) {
    // The page's login: POST /login with token=<token> in the form body sets the cookie
    // meshrun_token.
    http.Get("/login", [](const httplib::Request&, httplib::Response& response) {
      response.set_content(LoginPage("Sign in with a token."), "text/html");
    });
    http.Post("/login", [this, tls](const httplib::Request& request,
                                    httplib::Response& response) {
      const auto refuse = [&](int status, const std::string& why, const std::string& page) {
        spdlog::warn("refused HTTP login from {}: {}", request.remote_addr, why);
        response.status = status;
        response.set_content(LoginPage(page), "text/html");
      };
      if (absl::Status same = CheckSameOrigin(request, tls); !same.ok()) {
        return refuse(403, std::string(same.message()),
                      "Sign in from this dashboard's own page.");
      }
      if (request.target.find('?') != std::string::npos) {
        return refuse(400, "a query string on POST /login (the token belongs in the form body)",
                      "Send the token in the form body, never in the URL (URLs are logged).");
      }
      if (request.get_param_value_count("token") != 1) {
        return refuse(400, "the form has no single token field", "Give one token.");
      }
      const std::string token = request.get_param_value("token");
      std::optional<Identity> identity =
          tokens_ == nullptr ? std::nullopt : tokens_->Lookup(token);
      if (!identity.has_value() ||
          !Authorize("/meshrun.v1.Coordinator/ListJobs", identity).ok()) {
        return refuse(401,
                      identity.has_value() ? "role " + RoleName(identity->role) + " cannot view"
                                           : "unknown or revoked token",
                      "That token is unknown, revoked, or cannot view.");
      }
      spdlog::info("HTTP login of token \"{}\" from {}", identity->name, request.remote_addr);
      response.status = 303;
      response.set_header("Location", "/");
      response.set_header("Set-Cookie", absl::StrCat(kLoginCookie, "=", token,
                                                     "; Path=/; HttpOnly; SameSite=Strict",
                                                     tls ? "; Secure" : ""));
    });
    // Logging out needs no origin check: at worst another site signs a browser out.
    http.Post("/logout", [tls](const httplib::Request&, httplib::Response& response) {
      response.status = 303;
      response.set_header("Location", "/login");
      response.set_header("Set-Cookie", absl::StrCat(kLoginCookie,
                                                     "=; Path=/; Max-Age=0; HttpOnly; "
                                                     "SameSite=Strict",
                                                     tls ? "; Secure" : ""));
    });
  }
  http.set_pre_routing_handler([this, allowed](const httplib::Request& request,
                                               httplib::Response& response) {
    if (check_host_ && request.has_header("Host") &&
        !LoopbackHost(request.get_header_value("Host"))) {
      const std::string host = request.get_header_value("Host");
      spdlog::warn("refused HTTP {} {} from {}: Host \"{}\" is not a loopback name or address",
                   request.method, request.path, request.remote_addr, host);
      response.status = 421;
      response.set_content(
          absl::StrCat("MISDIRECTED: this dashboard serves loopback only; Host \"", host,
                       "\" is not a loopback name or address (a web page reaching it through "
                       "DNS rebinding?); open it as http://127.0.0.1:<port>/ or "
                       "http://localhost:<port>/\n"),
          "text/plain");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (!enforcing_ || request.path == "/login" || request.path == "/logout") {
      return httplib::Server::HandlerResponse::Unhandled;
    }
    std::optional<Identity> identity = CertificateIdentity(request);
    const std::string token = identity.has_value() ? "" : BearerToken(request);
    if (!identity.has_value() && !token.empty() && tokens_ != nullptr) {
      identity = tokens_->Lookup(token);
    }
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
}

}  // namespace meshrun::services
