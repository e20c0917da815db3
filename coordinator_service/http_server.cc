#include "coordinator_service/http_server.h"
#include "rpc/http_auth.h"

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
  bool greeted = false;
  absl::Time last_write = absl::Now();
};

}  // namespace

HttpServer::HttpServer(Config config)
    : config_(std::move(config)), server_(MakeHttplibServer()) {}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(Config config) {
  ASSIGN_OR_RETURN(HostPort address, ParseHostPort("http_listen", config.listen));
  if (config.api == nullptr || config.max_streams < 1) {
    return absl::InvalidArgumentError("HttpServer needs an api and max_streams >= 1");
  }
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(config)));
  httplib::Server& http = *server->server_;
  RETURN_IF_ERROR(InstallHttpAccessControl(http, address.host));
  DashboardApi* api = server->config_.api;
  const std::string& root = server->config_.web_root;
  std::error_code error;
  if (!root.empty() && std::filesystem::exists(root + "/index.html", error)) {
    http.set_mount_point("/", root);
  } else {
    spdlog::warn("no dashboard assets in \"{}\" (build them: scripts/setup.sh, then the build); "
                 "serving /metrics and /api only", root);
  }
  http.set_keep_alive_timeout(2);
  http.set_read_timeout(5);
  http.set_payload_max_length(64 << 10);  // GET only; nothing needs a body

  http.Get("/api/watch", [s = server.get()](const httplib::Request& request,
                                            httplib::Response& response) {
    absl::StatusOr<HttpRequest> parsed = ToRequest(request);
    if (!parsed.ok()) return ReplyError(response, parsed.status());
    if (s->streams_.fetch_add(1) >= s->config_.max_streams) {
      s->streams_.fetch_sub(1);
      return ReplyError(response, absl::UnavailableError(absl::StrCat(
                                      "already serving ", s->config_.max_streams,
                                      " event streams; close one or retry later")));
    }
    absl::StatusOr<std::shared_ptr<telemetry::Watcher>> watcher =
        s->config_.api->OpenWatch(*parsed);
    if (!watcher.ok()) {
      s->streams_.fetch_sub(1);
      return ReplyError(response, watcher.status());
    }
    auto stream = std::make_shared<Stream>(Stream{.watcher = std::move(*watcher)});
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
        [s, stream](bool) {
          stream->watcher->Close();
          s->streams_.fetch_sub(1);
        });
  });
  http.Get(".*", [api](const httplib::Request& request, httplib::Response& response) {
    absl::StatusOr<HttpRequest> parsed = ToRequest(request);
    if (!parsed.ok()) return ReplyError(response, parsed.status());
    Reply(response, api->Handle(*parsed));
  });
  http.set_exception_handler([](const httplib::Request&, httplib::Response& response,
                                std::exception_ptr) {
    ReplyError(response, absl::InternalError("the request failed inside the server"));
  });

  if (address.port == 0) {
    server->port_ = http.bind_to_any_port(address.host);
  } else if (http.bind_to_port(address.host, address.port)) {
    server->port_ = address.port;
  } else {
    server->port_ = -1;
  }
  if (server->port_ <= 0) {
    return absl::UnavailableError(absl::StrCat("--http_listen=", server->config_.listen,
                                               ": cannot listen (port in use or address not "
                                               "local); pick another port or 0"));
  }
  server->thread_ = std::thread([s = server.get()] { s->server_->listen_after_bind(); });
  return server;
}

void HttpServer::Stop() {
  if (stopping_.exchange(true)) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

HttpServer::~HttpServer() { Stop(); }

}  // namespace meshrun::services
