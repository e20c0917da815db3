// The HTTP port's front: the listening socket, TLS handshakes, connection limits and threads,
// in front of Debian's cpp-httplib, which still parses and routes each request (HttpRouter).
// httplib's own accept loop is not used: it gives every accepted connection a thread at once,
// and its read timeout restarts with each byte, so a few connections trickling a handshake or a
// request head at 1 byte/s held every thread for as long as they liked.
//
//   - Staging. One thread accepts and, for all connections at once (poll), does the TLS
//     handshake and reads the request head and body (Content-Length only, at most
//     max_body_bytes; a chunked request body is refused with 411). A connection must deliver all
//     of that within `request_deadline` of its accept (or, kept alive, of its previous answer):
//     an absolute deadline that never restarts; past it the connection is closed.
//   - Serving. Only a complete request takes one of the `threads` workers, which routes it and
//     writes the answer (each write waits at most `write_timeout`). A kept-alive connection goes
//     back to staging between requests, so idle and slow connections hold no thread.
//   - Limits. At most max_connections_per_peer connections per peer address and max_connections
//     in all, staged or served; past them a new connection is closed at once. Refusals and
//     expiries are counted (stats()) and logged at most every 10 s with their counts.
//
// Lifetime: Start() serves until Stop() or destruction; the router (and the SSL_CTX) must
// outlive the listener. Thread-safety: port(), stats() and Stop() may be called from any thread;
// Stop() is idempotent. Handlers run on the worker threads, several at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace meshrun::services {

// httplib's router and request parser, driven by HttpListener instead of httplib's own listen().
class HttpRouter : public httplib::Server {
 public:
  // Parses one request from `stream`, routes it and writes the answer (httplib's
  // process_request). Returns false when the connection must close.
  bool ServeOne(httplib::Stream& stream, bool close_connection, bool& connection_closed,
                const std::function<void(httplib::Request&)>& setup);
  // httplib ends chunked (SSE) answers once the listening socket is invalid; the listener sets
  // it while serving and clears it at Stop().
  void SetListening(int fd) { svr_sock_ = fd; }
};

class HttpListener {
 public:
  struct Config {
    std::string host;  // as ParseHostPort gives it
    int port = 0;      // 0 picks a free port
    HttpRouter* router = nullptr;       // required
    std::shared_ptr<SSL_CTX> tls;       // null: plaintext
    int threads = 8;
    absl::Duration request_deadline = absl::Seconds(5);  // handshake + head + body, absolute
    absl::Duration write_timeout = absl::Seconds(5);     // each write
    int max_connections_per_peer = 16;
    int max_connections = 512;
    size_t max_head_bytes = 16 << 10;
    size_t max_body_bytes = 64 << 10;
    int max_requests_per_connection = 100;
  };

  struct Stats {
    int64_t accepted = 0;
    int64_t refused_peer_limit = 0;  // past max_connections_per_peer
    int64_t refused_full = 0;        // past max_connections
    int64_t expired = 0;             // past request_deadline before a complete request
    int64_t served = 0;              // requests handed to a worker
    int64_t open = 0;                // connections open now
  };

  // Errors: INVALID_ARGUMENT (no router, threads < 1), UNAVAILABLE (cannot bind or listen:
  // the port is in use or the address is not local).
  static absl::StatusOr<std::unique_ptr<HttpListener>> Start(Config config);
  ~HttpListener();

  int port() const { return port_; }
  Stats stats() const;
  // Closes the listener and staged connections, ends served ones as their handlers return
  // (SSE handlers see the router's listening socket cleared), and joins every thread.
  void Stop();

  struct Connection;

 private:
  explicit HttpListener(Config config);
  void Stage();
  void Work();
  void Accept(std::vector<std::unique_ptr<Connection>>& staged);
  void Close(std::unique_ptr<Connection> connection);
  void Refused(int64_t Stats::*counter, const char* what, const std::string& peer);

  const Config config_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // an eventfd: Stop() and connections back from the workers
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread stager_;
  std::vector<std::thread> workers_;

  mutable absl::Mutex mu_;
  absl::CondVar ready_cv_;
  // Complete requests, for the workers.
  std::deque<std::unique_ptr<Connection>> ready_ ABSL_GUARDED_BY(mu_);
  // Kept alive, back to staging.
  std::deque<std::unique_ptr<Connection>> returned_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, int> per_peer_ ABSL_GUARDED_BY(mu_);  // open connections per address
  Stats stats_ ABSL_GUARDED_BY(mu_);
  absl::Time last_warning_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  Stats warned_ ABSL_GUARDED_BY(mu_);  // the counts at the last warning
};

}  // namespace meshrun::services
