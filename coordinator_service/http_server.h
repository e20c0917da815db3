// The coordinator's HTTP port: a thin adapter (Debian's cpp-httplib) that serves the web
// dashboard's static files from `web_root` and hands everything else to DashboardApi.
//
// Server-sent events (/api/watch) each hold one of the server's threads while the stream is
// open, so at most `max_streams` are served at once; more get 503 and the other paths stay
// responsive. A stream sends a comment every `keepalive` while idle, which also notices
// clients that went away.
//
// Lifetime: Start() returns a serving server; Stop() (or the destructor) closes the listener,
// ends open streams within about a second, and joins the thread. `api` must outlive it.
// Thread-safety: port() and Stop() may be called from any thread; Stop() is idempotent.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator_service/dashboard_api.h"

namespace httplib {
class Server;
}

namespace meshrun::services {

class HttpServer {
 public:
  struct Config {
    std::string listen;    // HOST:PORT; port 0 picks a free port
    std::string web_root;  // folder with index.html; empty or missing: API only (logged)
    DashboardApi* api = nullptr;  // required
    int max_streams = 4;
    absl::Duration keepalive = absl::Seconds(15);
  };

  // Errors: INVALID_ARGUMENT (malformed listen address, null api, max_streams < 1),
  // UNAVAILABLE (cannot bind), both naming --http_listen and the address.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(Config config);
  ~HttpServer();

  int port() const { return port_; }
  void Stop();

 private:
  explicit HttpServer(Config config);
  void Serve();

  const Config config_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> streams_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace meshrun::services
