// The coordinator's HTTP port: a thin adapter that serves the web dashboard's static files from
// `web_root` and hands everything else to DashboardApi. rpc/http_listener.h owns the sockets
// and threads (a connection gets a thread only once its whole request has arrived, within an
// absolute deadline; connections per peer address are capped); Debian's cpp-httplib parses and
// routes; rpc/http_auth.h decides who may ask (and adds the security headers).
//
// Server-sent events (/api/watch) each hold one of the server's threads while the stream is
// open, so they are capped, per identity and in all, with admin identities counted apart from
// everyone else: one caller cannot take every stream. Past a cap: 429 (the identity's share,
// --http_max_streams_per_identity) or 503 (all streams, --http_max_streams /
// --http_max_admin_streams), naming the limit and its flag. A stream sends a comment every
// `keepalive` while idle, which also notices clients that went away; a stream a bearer token
// opened ends (event "end", UNAUTHENTICATED) within about a second of the token's removal from
// the tokens file.
//
// Lifetime: Start() returns a serving server; Stop() (or the destructor) closes the listener,
// ends open streams within about a second, and joins the threads. `api` must outlive it.
// Thread-safety: port() and Stop() may be called from any thread; Stop() is idempotent.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "coordinator_service/dashboard_api.h"
#include "rpc/http_auth.h"
#include "rpc/http_listener.h"
#include "rpc/per_key_slots.h"

namespace meshrun::services {

class HttpServer {
 public:
  struct Config {
    std::string listen;    // HOST:PORT; port 0 picks a free port
    std::string web_root;  // folder with index.html; empty or missing: API only (logged)
    DashboardApi* api = nullptr;  // required
    // Event streams of identities other than admin, in all and per identity (an
    // unauthenticated loopback port has one identity, "anonymous", capped by the total only),
    // and of admin identities (in all; per identity as the others).
    int max_streams = 8;                // --http_max_streams
    int max_streams_per_identity = 2;   // --http_max_streams_per_identity
    int max_admin_streams = 2;          // --http_max_admin_streams
    absl::Duration keepalive = absl::Seconds(15);
    // Handshake, request head and body must arrive within this of the accept (absolute).
    absl::Duration request_deadline = absl::Seconds(5);
    int max_connections_per_peer = 16;
    // Threads for requests other than event streams (streams get one each on top).
    int request_threads = 4;
  };

  // Errors: INVALID_ARGUMENT (malformed listen address, null api, a stream limit < 1),
  // UNAVAILABLE (cannot bind), both naming --http_listen and the address; the access
  // control's (HttpAccessControl::Install).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(Config config);
  ~HttpServer();

  int port() const { return listener_ ? listener_->port() : 0; }
  HttpListener::Stats connection_stats() const { return listener_->stats(); }
  void Stop();

 private:
  explicit HttpServer(Config config);
  void InstallRoutes();

  const Config config_;
  std::unique_ptr<HttpRouter> router_;
  std::unique_ptr<HttpAccessControl> access_;
  PerKeySlots view_streams_;       // identities other than admin
  PerKeySlots admin_streams_;      // admin identities
  PerKeySlots anonymous_streams_;  // no access policy: the total only
  std::unique_ptr<HttpListener> listener_;
  std::atomic<bool> stopping_{false};
};

}  // namespace meshrun::services
