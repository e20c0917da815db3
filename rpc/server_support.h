// What every meshrun binary needs around its gRPC server: flag validation, a state directory,
// a server with health and reflection, gRPC's own logs routed into ours, and a signal wait.
//
// Thread-safety: the functions are safe to call from one thread at start-up; the returned
// server is as thread-safe as grpc::Server.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/tls_credentials.h"

namespace meshrun::services {

// The largest message a meshrun client accepts, and a worker server's default (the
// coordinator's CompileProgram carries a whole program).
inline constexpr int kMaxMessageBytes = 256 << 20;

// What a server lets callers send it. gRPC 1.51 buffers a request message whole before it
// checks its size (upstream: grpc/grpc#43012), so the message limit alone does not bound memory:
// `max_buffered_bytes` is gRPC's resource quota on the server's transport buffers, past which
// gRPC resets streams (RESOURCE_EXHAUSTED "Buffers full" to their callers) rather than grow.
struct ReceiveLimits {
  int64_t max_message_bytes = kMaxMessageBytes;  // larger: RESOURCE_EXHAUSTED, unread
  int64_t max_buffered_bytes = 0;                // 0: no quota
};

struct HostPort {
  std::string host;  // as written, brackets removed for IPv6
  int port = 0;
};

// Parses "HOST:PORT" ("127.0.0.1:7070", "[::]:0", "node-3:7071").
// Errors: INVALID_ARGUMENT naming `flag`, the value and the expected form.
absl::StatusOr<HostPort> ParseHostPort(const std::string& flag, const std::string& address);

// Creates `path` if needed, private to this user (mode 0700), and checks that files can be
// written in it. An existing directory that other users may read, write or enter (any group or
// other bit) is narrowed to owner-only, with everything under it (directories 0700-masked, files
// 0600-masked; symbolic links are left alone and not followed), and a warning names it: an older
// meshrun left state 0755/0644. The binaries also narrow their umask (rpc/binary_setup.h), so
// what they create under it later is private too.
// Errors: FAILED_PRECONDITION naming `flag`, the path, the system's reason and the fix (also
// when the directory cannot be narrowed: it belongs to another user).
absl::Status PrepareStateDir(const std::string& flag, const std::string& path);

// The default state directory: $XDG_STATE_HOME/meshrun/<component>, else
// $HOME/.local/state/meshrun/<component>, else ./.meshrun-state/<component>.
std::string DefaultStateDir(const std::string& component);

struct StartedServer {
  std::unique_ptr<grpc::Server> server;
  int port = 0;  // the bound port (useful with port 0)
};

// Builds and starts a server on `address` with `services`, the standard gRPC health service
// (overall status SERVING) and server reflection, taking at most what `limits` allow.
// SO_REUSEPORT is off, so a port in use is an error rather than a silent second listener.
// With `async_queue`, it also gets a completion queue for the services' async methods: the
// caller polls it, and shuts it down after the server (a queue is drained before it goes).
// Errors: INVALID_ARGUMENT (malformed address), UNAVAILABLE (cannot listen: port in use or
// address not local), both naming the address.
absl::StatusOr<StartedServer> StartGrpcServer(
    const std::string& flag, const std::string& address,
    const std::vector<grpc::Service*>& services, const ReceiveLimits& limits = {},
    std::unique_ptr<grpc::ServerCompletionQueue>* async_queue = nullptr);

// Shuts `queue` down and discards what is left on it (tags of a server that never served).
void DrainQueue(grpc::ServerCompletionQueue& queue);

// Marks the health service NOT_SERVING, then shuts the server down: in-flight calls get until
// `deadline` to finish and are cancelled after. Returns when the server has stopped.
void DrainServer(grpc::Server& server, absl::Duration deadline);

// gRPC logs through its own channel; route those lines to spdlog at debug level so users see
// meshrun's single explanatory line, and --log_level=debug still shows gRPC's detail.
void RouteGrpcLogsToSpdlog();

// Blocks SIGTERM and SIGINT in the calling thread and every thread it starts later; call at
// the top of main. WaitForTerminationSignal then returns the signal number once one arrives.
void BlockTerminationSignals();
int WaitForTerminationSignal();

// SIGTERM and SIGINT from construction on (call BlockTerminationSignals first). Until
// MarkStarted, a signal ends the process at once with exit status 0 and one line naming the
// start-up stage: start-up may block in code meshrun does not control (a plugin initialising,
// a metadata server), and nothing has been accepted yet that a drain would finish. After
// MarkStarted, Wait returns the signal for the caller to drain.
// Thread-safety: every method may be called from any thread. Construct at most one per process;
// it lives until the process exits (its thread is detached).
class TerminationSignalWatch {
 public:
  explicit TerminationSignalWatch(std::string program);
  void SetStage(std::string stage);  // "creating the PJRT client", logged if a signal ends it
  void MarkStarted();
  int Wait();  // blocks until a signal arrives after MarkStarted; returns its number

 private:
  struct Shared;
  std::shared_ptr<Shared> shared_;
};

// A client channel with meshrun's defaults (no proxy lookups) and the process's credentials
// (rpc/tls_credentials.h: mutual TLS and token when configured, else plaintext).
// Without `expect`, any server with a certificate from the cluster CA will do.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const std::optional<ExpectedServer>& expect = std::nullopt);
// security: a channel to the coordinator (its certificate must say coordinator), or to the
// worker of `host` (worker/<host>; any worker when `host` is empty).
std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& address);
std::shared_ptr<grpc::Channel> MakeWorkerChannel(const std::string& address,
                                                 const std::string& host);

// A context whose deadline is `timeout` from now. Every meshrun client call has one.
std::unique_ptr<grpc::ClientContext> ContextWithTimeout(absl::Duration timeout);

}  // namespace meshrun::services
