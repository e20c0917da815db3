// A TCP listener on 127.0.0.1 that never accepts: connections complete in the kernel's backlog
// and then hear nothing, as from a hung worker. Tests register it as a worker's address so the
// coordinator's calls there wait out their deadlines.
//
// Lifetime: listens from construction until destruction. Thread-safety: immutable.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

namespace meshrun::testing {

class BlackHole {
 public:
  BlackHole() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(fd_, 1024) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;  // port() 0: the test fails where it registers the address
    }
    port_ = ntohs(addr.sin_port);
  }
  ~BlackHole() {
    if (fd_ >= 0) close(fd_);
  }
  BlackHole(const BlackHole&) = delete;
  BlackHole& operator=(const BlackHole&) = delete;

  int port() const { return port_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }

 private:
  int fd_ = -1;
  int port_ = 0;
};

}  // namespace meshrun::testing
