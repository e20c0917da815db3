// The coordinator's HTTP API (coordinator_service/dashboard_api.h behind coordinator_service/http_server.h) on any
// request target: a real coordinator listens on 127.0.0.1:0 in this process, and each input
// becomes one GET request line (bytes a request line cannot hold are percent-encoded; a second
// input line, if any, is sent as Last-Event-ID). Seeds: the API's documented paths and queries.
// Property: every request gets a well-formed answer that is not a 500, and the server keeps
// answering.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "fuzz/fuzz_support.h"
#include "coordinator_service/coordinator_server.h"

namespace {
using namespace meshrun;

std::unique_ptr<services::CoordinatorServer>* server = nullptr;

std::string Encode(absl::string_view raw) {
  std::string out;
  for (unsigned char c : raw) {
    if (c > 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += absl::StrFormat("%%%02X", c);
    }
  }
  return out;
}

// The whole answer to one request (Connection: close), or "" when none came.
std::string Exchange(const std::string& request) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) __builtin_trap();
  timeval timeout{.tv_sec = 10, .tv_usec = 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof(timeout));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>((*server)->http_port()));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string answer;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
      send(fd, request.data(), request.size(), MSG_NOSIGNAL) ==
          static_cast<ssize_t>(request.size())) {
    char buffer[4096];
    for (ssize_t n; (n = recv(fd, buffer, sizeof(buffer), 0)) > 0;) answer.append(buffer, n);
  }
  close(fd);
  return answer;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fuzz::QuietLogs();
  fuzz::MaybeWriteSeeds({"/metrics", "/api/jobs", "/api/job?id=job-1", "/api/workers",
                         "/api/memory?host=host-a", "/api/series?job=job-1",
                         "/api/watch?job=job-1&since_step=3\n7", "/api/job?id=a&id=b",
                         "/api/job?id=%41%zz", "/api/watch?job=j&since_step=-1"});
  auto started = services::CoordinatorServer::Start({.listen = "127.0.0.1:0",
                                                     .state_dir = fuzz::ScratchDir("coordinator"),
                                                     .http_listen = "127.0.0.1:0"});
  if (!started.ok()) {
    std::fprintf(stderr, "fuzz: coordinator: %s\n", started.status().ToString().c_str());
    __builtin_trap();
  }
  server = new std::unique_ptr<services::CoordinatorServer>(std::move(*started));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t newline = input.find('\n');
  std::string target = Encode(input.substr(0, newline));
  if (target.empty() || target[0] != '/') target.insert(0, "/");
  std::string request = "GET " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  if (newline != absl::string_view::npos) {
    request += "Last-Event-ID: " + Encode(input.substr(newline + 1)) + "\r\n";
  }
  request += "\r\n";
  const std::string answer = Exchange(request);
  if (!absl::StartsWith(answer, "HTTP/1.1 ")) {
    std::fprintf(stderr, "fuzz: no HTTP answer to %s\n", request.c_str());
    __builtin_trap();
  }
  if (absl::StartsWith(answer, "HTTP/1.1 500")) {
    std::fprintf(stderr, "fuzz: 500 for %s:\n%s\n", request.c_str(), answer.c_str());
    __builtin_trap();
  }
  return 0;
}
