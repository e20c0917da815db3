#include "coordinator_service/http_server.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "rpc/server_support.h"

namespace meshrun::services {
namespace {

// The request as DashboardApi sees it; a parameter given twice is refused (named).
absl::StatusOr<HttpRequest> ToRequest(const httplib::Request& request) {
  HttpRequest out{.path = request.path,
                  .last_event_id = request.get_header_value("Last-Event-ID"),
                  .method = request.method};
  for (const auto& [name, value] : request.params) {
    if (!out.params.emplace(name, value).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("query parameter \"", name, "\" is given twice; give it once"));
    }
  }
  return out;
}

void Reply(httplib::Response& response, const HttpResponse& answer) {
  response.status = answer.status;
  response.set_header("Cache-Control", "no-store");
  response.set_content(answer.body, answer.content_type.c_str());
}

void ReplyError(httplib::Response& response, const absl::Status& status) {
  Reply(response, DashboardApi::ErrorResponse(status));
}

// One open /api/watch stream.
struct Stream {
  std::shared_ptr<telemetry::Watcher> watcher;
  PerKeySlots::Slot slot;  // counts it against the stream limits
  TokenRecheck recheck;    // the token that opened it must stay in the tokens file
  bool greeted = false;
  absl::Time last_write = absl::Now();
};

}  // namespace

HttpServer::HttpServer(Config config)
    : config_(std::move(config)),
      router_(std::make_unique<HttpRouter>()),
      view_streams_(config_.max_streams, config_.max_streams_per_identity, "event streams",
                    "--http_max_streams", "--http_max_streams_per_identity"),
      admin_streams_(config_.max_admin_streams, config_.max_streams_per_identity,
                     "admin event streams", "--http_max_admin_streams",
                     "--http_max_streams_per_identity"),
      anonymous_streams_(config_.max_streams, 0, "event streams", "--http_max_streams", "") {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Config config) {
  ASSIGN_OR_RETURN(HostPort address, ParseHostPort("http_listen", config.listen));
  if (config.api == nullptr || config.max_streams < 1 || config.max_streams_per_identity < 1 ||
      config.max_admin_streams < 1 || config.request_threads < 1) {
    return absl::InvalidArgumentError(
        "HttpServer needs an api, and stream limits (--http_max_streams, "
        "--http_max_streams_per_identity, --http_max_admin_streams) of at least 1");
  }
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(config)));
  HttpRouter& http = *server->router_;
  ASSIGN_OR_RETURN(server->access_, HttpAccessControl::Install(http, address.host));
  ASSIGN_OR_RETURN(std::shared_ptr<SSL_CTX> tls, MakeHttpsContext());
  InstallSecurityHeaders(http, tls != nullptr);
  const std::string& root = server->config_.web_root;
  std::error_code error;
  if (!root.empty() && std::filesystem::exists(root + "/index.html", error)) {
    http.set_mount_point("/", root);
  } else {
    spdlog::warn("no dashboard assets in \"{}\" (build them: scripts/setup.sh, then the build); "
                 "serving /metrics and /api only", root);
  }
  http.set_keep_alive_timeout(2);
  http.set_payload_max_length(64 << 10);  // GET, and the login form
  server->InstallRoutes();

  const Config& c = server->config_;
  absl::StatusOr<std::unique_ptr<HttpListener>> listener = HttpListener::Start(
      {.host = address.host,
       .port = address.port,
       .router = &http,
       .tls = std::move(tls),
       .threads = c.max_streams + c.max_admin_streams + c.request_threads,
       .request_deadline = c.request_deadline,
       .max_connections_per_peer = c.max_connections_per_peer});
  if (!listener.ok()) {
    return absl::UnavailableError(absl::StrCat("--http_listen=", c.listen, ": ",
                                               listener.status().message(),
                                               "; pick another port or 0"));
  }
  server->listener_ = *std::move(listener);
  return server;
}

void HttpServer::InstallRoutes() {
  HttpRouter& http = *router_;
  http.Get("/api/watch", [s = this](const httplib::Request& request,
                                    httplib::Response& response) {
    absl::StatusOr<HttpRequest> parsed = ToRequest(request);
    if (!parsed.ok()) return ReplyError(response, parsed.status());
    const std::optional<Identity> identity = s->access_->Identify(request);
    absl::StatusOr<PerKeySlots::Slot> slot =
        !identity.has_value() ? s->anonymous_streams_.Acquire("anonymous")
        : identity->role == Role::kAdmin
            ? s->admin_streams_.Acquire(absl::StrCat(identity->source, " identity \"",
                                                     identity->name, "\""))
            : s->view_streams_.Acquire(absl::StrCat(identity->source, " identity \"",
                                                    identity->name, "\""));
    if (!slot.ok()) {
      spdlog::warn("refused HTTP event stream from {}: {}", request.remote_addr,
                   std::string(slot.status().message()));
      ReplyError(response, slot.status());
      if (absl::IsResourceExhausted(slot.status())) {  // this identity's share: 429
        response.status = 429;
        response.set_header("Retry-After", "5");
      }
      return;
    }
    absl::StatusOr<std::shared_ptr<telemetry::Watcher>> watcher =
        s->config_.api->OpenWatch(*parsed);
    if (!watcher.ok()) return ReplyError(response, watcher.status());
    auto stream = std::make_shared<Stream>(Stream{.watcher = std::move(*watcher),
                                                  .slot = std::move(*slot),
                                                  .recheck = s->access_->Recheck(request)});
    response.set_header("Cache-Control", "no-store");
    response.set_chunked_content_provider(
        "text/event-stream",
        [s, stream](size_t, httplib::DataSink& sink) {
          auto write = [&](const std::string& text) {
            stream->last_write = absl::Now();
            return sink.write(text.data(), text.size());
          };
          if (!stream->greeted) {
            stream->greeted = true;
            return write("retry: 2000\n\n");  // reconnect quickly; Last-Event-ID resumes
          }
          if (s->stopping_) return false;
          // Called at least once a second: a revoked token ends the stream within that.
          if (absl::Status still = stream->recheck.Check(); !still.ok()) {
            spdlog::warn("HTTP event stream ended: {}", std::string(still.message()));
            if (!write(DashboardApi::EndEvent(still, stream->watcher->resume_step()))) {
              return false;
            }
            sink.done();
            return true;
          }
          // Bounded wait, so Stop() ends the stream within about a second.
          telemetry::Watcher::PopResult next = stream->watcher->Pop(absl::Seconds(1));
          switch (next.kind) {
            case telemetry::Watcher::Kind::kItem:
              return write(DashboardApi::SummaryEvent(*next.summary));
            case telemetry::Watcher::Kind::kEmpty:
              if (absl::Now() - stream->last_write >= s->config_.keepalive) {
                return write(": keepalive\n\n");
              }
              return true;
            case telemetry::Watcher::Kind::kEnd:
              // Overflow ends with RESOURCE_EXHAUSTED; the client resumes from resume_step.
              if (!write(DashboardApi::EndEvent(next.status, stream->watcher->resume_step()))) {
                return false;
              }
              sink.done();
              return true;
          }
          return false;
        },
        [stream](bool) {
          stream->watcher->Close();
          stream->slot = PerKeySlots::Slot();  // the slot is free as soon as the stream ends
        });
  });
  DashboardApi* api = config_.api;
  http.Get(".*", [api](const httplib::Request& request, httplib::Response& response) {
    absl::StatusOr<HttpRequest> parsed = ToRequest(request);
    if (!parsed.ok()) return ReplyError(response, parsed.status());
    Reply(response, api->Handle(*parsed));
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& response,
                                std::exception_ptr) {
    ReplyError(response, absl::InternalError("the request failed inside the server"));
  });
}

void HttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  if (listener_ != nullptr) listener_->Stop();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace meshrun::services
