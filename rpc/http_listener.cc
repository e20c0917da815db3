#include "rpc/http_listener.h"

#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"

namespace meshrun::services {

bool HttpRouter::ServeOne(httplib::Stream& stream, bool close_connection,
                          bool& connection_closed,
                          const std::function<void(httplib::Request&)>& setup) {
  return process_request(stream, close_connection, connection_closed, setup);
}

struct HttpListener::Connection {
  ~Connection() {
    if (ssl != nullptr) {
      if (handshaken) SSL_shutdown(ssl);  // best effort: the socket does not block
      SSL_free(ssl);
    }
    if (fd >= 0) ::close(fd);
  }

  int fd = -1;
  SSL* ssl = nullptr;  // owned; null in plaintext
  bool handshaken = false;
  std::string peer;  // the peer's address, the key of the per-peer limit
  int peer_port = 0;
  std::string local;
  int local_port = 0;
  std::string in;    // received and not yet consumed by the router
  size_t need = 0;   // the size of the complete request at the front of `in`; 0: head not yet read
  absl::Time deadline;
  short events = POLLIN;  // what staging waits for
  int requests = 0;
};

namespace {

using Connection = HttpListener::Connection;

int PollMillis(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  return static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(d) + 1, 1 << 30));
}

bool WaitFor(int fd, short events, absl::Duration timeout) {
  pollfd p{.fd = fd, .events = events, .revents = 0};
  int r;
  do {
    r = ::poll(&p, 1, PollMillis(timeout));
  } while (r < 0 && errno == EINTR);
  return r > 0 && (p.revents & (events | POLLHUP | POLLERR)) != 0;
}

void Address(const sockaddr_storage& addr, socklen_t len, std::string& ip, int& port) {
  char host[NI_MAXHOST] = {0};
  char serv[NI_MAXSERV] = {0};
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, host, sizeof(host), serv,
                  sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    ip = "?";
    port = 0;
    return;
  }
  ip = host;
  if (absl::StartsWith(ip, "::ffff:") && ip.find('.') != std::string::npos) ip = ip.substr(7);
  port = std::atoi(serv);
}

// The answer staging sends itself (best effort) before closing a connection whose request it
// refuses.
void RefuseRequest(Connection& c, int code, const char* reason, const std::string& why) {
  const std::string body = absl::StrCat(why, "\n");
  const std::string text =
      absl::StrCat("HTTP/1.1 ", code, " ", reason,
                   "\r\nContent-Type: text/plain\r\nContent-Length: ",
                   body.size(), "\r\nConnection: close\r\n\r\n", body);
  if (c.ssl != nullptr) {
    ERR_clear_error();
    SSL_write(c.ssl, text.data(), static_cast<int>(text.size()));
  } else {
    (void)::send(c.fd, text.data(), text.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  }
}

enum class Step { kWait, kReady, kClose };

// Parses the head at the front of c.in once it is complete: sets c.need, or refuses.
Step ParseHead(Connection& c, size_t max_head, size_t max_body) {
  const size_t end = c.in.find("\r\n\r\n");
  if (end == std::string::npos) {
    if (c.in.size() <= max_head) return Step::kWait;
    RefuseRequest(c, 431, "Request Header Fields Too Large",
                  absl::StrCat("the request head is over ", max_head, " bytes"));
    return Step::kClose;
  }
  if (end + 4 > max_head) {
    RefuseRequest(c, 431, "Request Header Fields Too Large",
                  absl::StrCat("the request head is over ", max_head, " bytes"));
    return Step::kClose;
  }
  std::optional<uint64_t> length;
  bool first = true;
  for (absl::string_view line : absl::StrSplit(absl::string_view(c.in).substr(0, end), "\r\n")) {
    if (first) {
      first = false;
      continue;
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) continue;  // httplib refuses it (400)
    const std::string name =
        absl::AsciiStrToLower(absl::StripAsciiWhitespace(line.substr(0, colon)));
    const absl::string_view value = absl::StripAsciiWhitespace(line.substr(colon + 1));
    if (name == "transfer-encoding") {
      RefuseRequest(c, 411, "Length Required",
                    "send the request body with Content-Length (Transfer-Encoding is refused)");
      return Step::kClose;
    }
    if (name != "content-length") continue;
    uint64_t n = 0;
    if (value.empty() || value.find_first_not_of("0123456789") != absl::string_view::npos ||
        !absl::SimpleAtoi(value, &n) || (length.has_value() && *length != n)) {
      RefuseRequest(c, 400, "Bad Request", "Content-Length is not one decimal number");
      return Step::kClose;
    }
    length = n;
  }
  if (length.value_or(0) > max_body) {
    RefuseRequest(c, 413, "Payload Too Large",
                  absl::StrCat("the request body is over ", max_body, " bytes"));
    return Step::kClose;
  }
  c.need = end + 4 + length.value_or(0);
  return Step::kReady;
}

// Handshakes and reads without blocking until the request at the front of c.in is complete.
Step Advance(Connection& c, size_t max_head, size_t max_body) {
  if (c.ssl != nullptr && !c.handshaken) {
    ERR_clear_error();
    const int r = SSL_accept(c.ssl);
    if (r != 1) {
      const int error = SSL_get_error(c.ssl, r);
      if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
        c.events = error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
        return Step::kWait;
      }
      char text[256] = {0};
      ERR_error_string_n(ERR_peek_last_error(), text, sizeof(text));
      spdlog::debug("HTTPS: handshake with {} failed: {}", c.peer, std::string(text));
      return Step::kClose;
    }
    c.handshaken = true;
  }
  c.events = POLLIN;
  char buffer[16 << 10];
  for (;;) {
    if (c.need == 0) {
      const Step head = ParseHead(c, max_head, max_body);
      if (head == Step::kClose) return head;
    }
    if (c.need != 0 && c.in.size() >= c.need) return Step::kReady;
    const size_t room =
        std::min(sizeof(buffer), max_head + max_body + sizeof(buffer) - c.in.size());
    ssize_t n;
    if (c.ssl != nullptr) {
      ERR_clear_error();
      const int r = SSL_read(c.ssl, buffer, static_cast<int>(room));
      if (r <= 0) {
        const int error = SSL_get_error(c.ssl, r);
        if (error == SSL_ERROR_WANT_READ || error == SSL_ERROR_WANT_WRITE) {
          c.events = error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
          return Step::kWait;
        }
        return Step::kClose;  // closed, or a TLS error
      }
      n = r;
    } else {
      do {
        n = ::recv(c.fd, buffer, room, MSG_DONTWAIT);
      } while (n < 0 && errno == EINTR);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return Step::kWait;
      if (n <= 0) return Step::kClose;
    }
    c.in.append(buffer, static_cast<size_t>(n));
  }
}

// What the router reads the staged request from and writes its answer to.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(Connection& c, absl::Duration write_timeout, const std::atomic<bool>& stopping)
      : c_(c), write_timeout_(write_timeout), stopping_(stopping) {}

  size_t consumed() const { return pos_; }

  bool is_readable() const override { return pos_ < c_.in.size(); }
  bool is_writable() const override {
    if (stopping_) return false;
    if (!WaitFor(c_.fd, POLLOUT, write_timeout_)) return false;
    char byte;
    const ssize_t n = ::recv(c_.fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK));
  }
  // Only the staged request: its bytes are all here, so the router never waits on the client.
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, c_.in.size() - pos_);
    std::memcpy(ptr, c_.in.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    size_t done = 0;
    while (done < size) {
      ssize_t n;
      short wait = POLLOUT;
      if (c_.ssl != nullptr) {
        ERR_clear_error();
        const int r = SSL_write(c_.ssl, ptr + done,
                                static_cast<int>(std::min<size_t>(size - done, 1 << 30)));
        if (r > 0) {
          n = r;
        } else {
          const int error = SSL_get_error(c_.ssl, r);
          if (error != SSL_ERROR_WANT_WRITE && error != SSL_ERROR_WANT_READ) return -1;
          wait = error == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT;
          n = 0;
        }
      } else {
        n = ::send(c_.fd, ptr + done, size - done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
        if (n < 0) n = 0;
      }
      done += static_cast<size_t>(n);
      if (n == 0 && !WaitFor(c_.fd, wait, write_timeout_)) return -1;  // a reader too slow
    }
    return static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.peer;
    port = c_.peer_port;
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    ip = c_.local;
    port = c_.local_port;
  }
  socket_t socket() const override { return c_.fd; }

 private:
  Connection& c_;
  const absl::Duration write_timeout_;
  const std::atomic<bool>& stopping_;
  size_t pos_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<HttpListener>> HttpListener::Start(Config config) {
  if (config.router == nullptr || config.threads < 1 || config.max_connections < 1 ||
      config.max_connections_per_peer < 1) {
    return absl::InvalidArgumentError(
        "HttpListener needs a router, threads >= 1 and connection limits >= 1");
  }
  std::unique_ptr<HttpListener> listener(new HttpListener(std::move(config)));
  const Config& c = listener->config_;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(c.port);
  std::string problem = "no address";
  if (const int r = getaddrinfo(c.host.empty() ? nullptr : c.host.c_str(), port.c_str(), &hints,
                                &found);
      r != 0) {
    problem = gai_strerror(r);
  }
  for (addrinfo* a = found; a != nullptr && listener->listen_fd_ < 0; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) continue;
    const int yes = 1, no = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &no, sizeof(no));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, 128) == 0) {
      listener->listen_fd_ = fd;
    } else {
      problem = std::strerror(errno);
      ::close(fd);
    }
  }
  if (found != nullptr) freeaddrinfo(found);
  if (listener->listen_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", c.host, ":", c.port, ": ",
                                               problem));
  }
  sockaddr_storage bound{};
  socklen_t length = sizeof(bound);
  getsockname(listener->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &length);
  std::string ip;
  Address(bound, length, ip, listener->port_);
  listener->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (listener->wake_fd_ < 0) return absl::InternalError("HttpListener: eventfd failed");
  c.router->SetListening(listener->listen_fd_);
  listener->stager_ = std::thread([l = listener.get()] { l->Stage(); });
  for (int i = 0; i < c.threads; ++i) {
    listener->workers_.emplace_back([l = listener.get()] { l->Work(); });
  }
  return listener;
}

HttpListener::HttpListener(Config config) : config_(std::move(config)) {}

HttpListener::~HttpListener() { Stop(); }

void HttpListener::Stop() {
  if (stopping_.exchange(true)) return;
  config_.router->SetListening(-1);  // ends chunked answers (SSE) in flight
  {
    absl::MutexLock l(&mu_);
    ready_cv_.SignalAll();
  }
  const uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!::write(wake_fd_, &one, sizeof(one));
  if (stager_.joinable()) stager_.join();
  for (std::thread& worker : workers_) worker.join();
  workers_.clear();
  std::deque<std::unique_ptr<Connection>> left;
  {
    absl::MutexLock l(&mu_);
    for (auto* queue : {&ready_, &returned_}) {
      for (auto& c : *queue) left.push_back(std::move(c));
      queue->clear();
    }
  }
  for (auto& c : left) Close(std::move(c));
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
  listen_fd_ = wake_fd_ = -1;
}

HttpListener::Stats HttpListener::stats() const {
  absl::MutexLock l(&mu_);
  return stats_;
}

void HttpListener::Refused(int64_t Stats::*counter, const char* what, const std::string& peer) {
  absl::MutexLock l(&mu_);
  ++(stats_.*counter);
  spdlog::debug("HTTP: {} from {}", what, peer);
  const absl::Time now = absl::Now();
  if (now - last_warning_ < absl::Seconds(10)) return;
  last_warning_ = now;
  spdlog::warn("HTTP: since the last report, closed {} connections past the {} per peer address, "
               "{} past the {} in all, and {} that sent no complete request within {} (last: {} "
               "from {})",
               stats_.refused_peer_limit - warned_.refused_peer_limit,
               config_.max_connections_per_peer, stats_.refused_full - warned_.refused_full,
               config_.max_connections, stats_.expired - warned_.expired,
               absl::FormatDuration(config_.request_deadline), what, peer);
  warned_ = stats_;
}

void HttpListener::Close(std::unique_ptr<Connection> connection) {
  {
    absl::MutexLock l(&mu_);
    auto it = per_peer_.find(connection->peer);
    if (it != per_peer_.end() && --it->second <= 0) per_peer_.erase(it);
    --stats_.open;
  }
  connection.reset();
}

void HttpListener::Accept(std::vector<std::unique_ptr<Connection>>& staged) {
  for (int round = 0; round < 64; ++round) {
    sockaddr_storage addr{};
    socklen_t length = sizeof(addr);
    const int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE) {
        spdlog::warn("HTTP: out of file descriptors; new connections wait");
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      return;
    }
    auto c = std::make_unique<Connection>();
    c->fd = fd;
    Address(addr, length, c->peer, c->peer_port);
    bool refused_full = false, refused_peer = false;
    {
      absl::MutexLock l(&mu_);
      int& open_here = per_peer_[c->peer];
      if (stats_.open >= config_.max_connections) {
        refused_full = true;
      } else if (open_here >= config_.max_connections_per_peer) {
        refused_peer = true;
      } else {
        ++open_here;
        ++stats_.open;
        ++stats_.accepted;
      }
      if (open_here == 0) per_peer_.erase(c->peer);
    }
    if (refused_full || refused_peer) {
      if (refused_full) {
        Refused(&Stats::refused_full, "a connection past the limit in all", c->peer);
      } else {
        Refused(&Stats::refused_peer_limit, "a connection past the limit per peer address",
                c->peer);
      }
      c.reset();  // closes it, once counted
      continue;
    }
    const int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
    sockaddr_storage local{};
    socklen_t local_length = sizeof(local);
    getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_length);
    Address(local, local_length, c->local, c->local_port);
    if (config_.tls != nullptr) {
      c->ssl = SSL_new(config_.tls.get());
      if (c->ssl == nullptr || SSL_set_fd(c->ssl, fd) != 1) {
        Close(std::move(c));
        continue;
      }
      SSL_set_mode(c->ssl, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
      SSL_set_accept_state(c->ssl);
    }
    c->deadline = absl::Now() + config_.request_deadline;
    staged.push_back(std::move(c));
  }
}

void HttpListener::Stage() {
  std::vector<std::unique_ptr<Connection>> staged;
  std::vector<pollfd> fds;
  const auto hand_over = [this](std::unique_ptr<Connection> c) {
    absl::MutexLock l(&mu_);
    ++stats_.served;
    ready_.push_back(std::move(c));
    ready_cv_.Signal();
  };
  const auto advance = [&](std::unique_ptr<Connection>& c) {
    switch (Advance(*c, config_.max_head_bytes, config_.max_body_bytes)) {
      case Step::kWait: return;
      case Step::kReady: return hand_over(std::move(c));
      case Step::kClose: return Close(std::move(c));
    }
  };
  while (!stopping_) {
    std::deque<std::unique_ptr<Connection>> back;
    {
      absl::MutexLock l(&mu_);
      back.swap(returned_);
    }
    for (auto& c : back) {  // a pipelined request may already be buffered
      advance(c);
      if (c != nullptr) staged.push_back(std::move(c));
    }
    absl::Time next = absl::Now() + absl::Seconds(1);
    fds.assign({{.fd = wake_fd_, .events = POLLIN, .revents = 0},
                {.fd = listen_fd_, .events = POLLIN, .revents = 0}});
    for (const auto& c : staged) {
      fds.push_back({.fd = c->fd, .events = c->events, .revents = 0});
      next = std::min(next, c->deadline);
    }
    const size_t polled = staged.size();
    if (::poll(fds.data(), fds.size(), PollMillis(next - absl::Now())) < 0 && errno != EINTR) {
      spdlog::error("HTTP: poll failed: {}", std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (fds[0].revents != 0) {
      uint64_t count;
      (void)!::read(wake_fd_, &count, sizeof(count));
    }
    for (size_t i = 0; i < polled; ++i) {
      if (fds[i + 2].revents != 0) advance(staged[i]);
    }
    if (fds[1].revents != 0) Accept(staged);
    const absl::Time now = absl::Now();
    for (auto& c : staged) {
      if (c == nullptr || now < c->deadline) continue;
      // Counted before the close, so whoever sees the close sees the count.
      Refused(&Stats::expired, "a connection with no complete request by its deadline", c->peer);
      Close(std::move(c));
    }
    staged.erase(std::remove(staged.begin(), staged.end(), nullptr), staged.end());
  }
  for (auto& c : staged) Close(std::move(c));
}

void HttpListener::Work() {
  for (;;) {
    std::unique_ptr<Connection> c;
    {
      absl::MutexLock l(&mu_);
      while (ready_.empty() && !stopping_) ready_cv_.Wait(&mu_);
      if (ready_.empty()) return;
      c = std::move(ready_.front());
      ready_.pop_front();
    }
    if (stopping_) {
      Close(std::move(c));
      continue;
    }
    ++c->requests;
    const bool last = c->requests >= config_.max_requests_per_connection;
    bool closed = false;
    bool ok = false;
    {
      ConnectionStream stream(*c, config_.write_timeout, stopping_);
      SSL* ssl = c->ssl;
      ok = config_.router->ServeOne(stream, last, closed,
                                    [ssl](httplib::Request& request) { request.ssl = ssl; });
      c->in.erase(0, std::max(stream.consumed(), c->need));
    }
    c->need = 0;
    if (!ok || closed || last || stopping_) {
      Close(std::move(c));
      continue;
    }
    c->deadline = absl::Now() + config_.request_deadline;
    {
      absl::MutexLock l(&mu_);
      returned_.push_back(std::move(c));
    }
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }
}

}  // namespace meshrun::services
