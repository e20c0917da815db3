#include "rpc/server_support.h"

#include <grpc/support/log.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/resource_quota.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "rpc/channel_health.h"
#include "rpc/tls_credentials.h"

namespace meshrun::services {

absl::StatusOr<HostPort> ParseHostPort(const std::string& flag, const std::string& address) {
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, "=", address, ": ", why,
                                                   "; expected HOST:PORT, e.g. 127.0.0.1:7070"));
  };
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return bad("no host or port");
  HostPort hp;
  hp.host = address.substr(0, colon);
  if (hp.host.front() == '[') {
    if (hp.host.back() != ']') return bad("unclosed '[' around an IPv6 host");
    hp.host = hp.host.substr(1, hp.host.size() - 2);
  } else if (hp.host.find(':') != std::string::npos) {
    return bad("an IPv6 host needs brackets, as in [::1]:7070");
  }
  if (hp.host.empty()) return bad("empty host");
  if (!absl::SimpleAtoi(address.substr(colon + 1), &hp.port) || hp.port < 0 || hp.port > 65535) {
    return bad("port must be a number from 0 to 65535");
  }
  return hp;
}

namespace {
// Clears the group and other bits of everything under `root` (not following links). Returns how
// many entries changed; entries it cannot change are logged.
int NarrowTree(const std::filesystem::path& root) {
  namespace fs = std::filesystem;
  int narrowed = 0;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root, fs::directory_options::skip_permission_denied,
                                           ec), end;
       !ec && it != end; it.increment(ec)) {
    const fs::file_status status = it->symlink_status(ec);
    if (ec || fs::is_symlink(status)) continue;
    const fs::perms open_bits = status.permissions() & (fs::perms::group_all | fs::perms::others_all);
    if (open_bits == fs::perms::none) continue;
    fs::permissions(it->path(), open_bits, fs::perm_options::remove, ec);
    if (ec) {
      spdlog::warn("cannot make {} private to this user: {}", it->path().string(), ec.message());
      ec.clear();
      continue;
    }
    ++narrowed;
  }
  return narrowed;
}
}  // namespace

absl::Status PrepareStateDir(const std::string& flag, const std::string& path) {
  namespace fs = std::filesystem;
  const auto fail = [&](const std::string& why, const std::string& fix) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--", flag, "=", path, " is not a usable state directory: ", why, "; ", fix));
  };
  const std::string kWritable = "pass a writable directory";
  if (path.empty()) return fail("empty path", kWritable);
  std::error_code ec;
  const bool existed = fs::exists(path, ec);
  fs::create_directories(path, ec);
  if (ec) return fail(ec.message(), kWritable);
  const fs::file_status status = fs::status(path, ec);
  if (ec || !fs::is_directory(status)) return fail("not a directory", kWritable);
  const fs::perms open_bits =
      status.permissions() & (fs::perms::group_all | fs::perms::others_all);
  if (open_bits != fs::perms::none) {
    fs::permissions(path, open_bits, fs::perm_options::remove, ec);
    if (ec) {
      return fail(absl::StrCat("other users may enter it and it cannot be made private (",
                               ec.message(), ")"),
                  "run as its owner, or chmod 700 it");
    }
    if (existed) {
      const int narrowed = NarrowTree(path);
      spdlog::warn(
          "--{}={} was open to other users (mode {:o}): made it and {} entries under it private "
          "to this user (directories 0700, files 0600)",
          flag, path, static_cast<unsigned>(status.permissions()), narrowed);
    }
  }
  const std::string probe = absl::StrCat(path, "/.write-probe-", getpid());
  {
    std::ofstream out(probe);
    out << "probe";
    if (!out) return fail(std::strerror(errno), kWritable);
  }
  fs::remove(probe, ec);
  return absl::OkStatus();
}

std::string DefaultStateDir(const std::string& component) {
  if (const char* xdg = std::getenv("XDG_STATE_HOME"); xdg != nullptr && *xdg != '\0') {
    return absl::StrCat(xdg, "/meshrun/", component);
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return absl::StrCat(home, "/.local/state/meshrun/", component);
  }
  return absl::StrCat(".meshrun-state/", component);
}

absl::StatusOr<StartedServer> StartGrpcServer(
    const std::string& flag, const std::string& address,
    const std::vector<grpc::Service*>& services, const ReceiveLimits& limits,
    std::unique_ptr<grpc::ServerCompletionQueue>* async_queue) {
  absl::StatusOr<HostPort> parsed = ParseHostPort(flag, address);
  if (!parsed.ok()) return parsed.status();
  const SecurityConfig& security = ProcessSecurity();
  if (absl::Status s = CheckPlaintextBind(security, flag, parsed->host); !s.ok()) return s;
  absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> credentials =
      MakeServerCredentials(security);
  if (!credentials.ok()) return credentials.status();
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(limits.max_message_bytes, std::numeric_limits<int>::max())));
  if (limits.max_buffered_bytes > 0) {
    grpc::ResourceQuota quota("meshrun-receive-buffers");
    quota.Resize(static_cast<size_t>(limits.max_buffered_bytes));
    builder.SetResourceQuota(quota);
  }
  AddServerKeepalive(builder);
  StartedServer started;
  builder.AddListeningPort(address, *credentials, &started.port);
  for (grpc::Service* service : services) builder.RegisterService(service);
  if (async_queue != nullptr) *async_queue = builder.AddCompletionQueue();
  started.server = builder.BuildAndStart();
  if (started.server == nullptr || started.port == 0) {
    if (started.server != nullptr) started.server->Shutdown();
    if (async_queue != nullptr) DrainQueue(**async_queue);
    return absl::UnavailableError(absl::StrCat(
        "--", flag, "=", address,
        ": cannot listen there (port already in use, or not an address of this machine)"));
  }
  started.server->GetHealthCheckService()->SetServingStatus(true);
  return started;
}

void DrainQueue(grpc::ServerCompletionQueue& queue) {
  queue.Shutdown();
  void* tag = nullptr;
  bool ok = false;
  while (queue.Next(&tag, &ok)) {
  }
}

void DrainServer(grpc::Server& server, absl::Duration deadline) {
  server.GetHealthCheckService()->SetServingStatus(false);
  server.Shutdown(absl::ToChronoTime(absl::Now() + deadline));
  server.Wait();
}

void RouteGrpcLogsToSpdlog() {
  gpr_set_log_verbosity(GPR_LOG_SEVERITY_DEBUG);
  gpr_set_log_function([](gpr_log_func_args* args) {
    if (spdlog::should_log(spdlog::level::debug)) {
      spdlog::debug("grpc {}:{}: {}", args->file, args->line, args->message);
    }
  });
}

namespace {
sigset_t TerminationSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}
}  // namespace

void BlockTerminationSignals() {
  sigset_t set = TerminationSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

int WaitForTerminationSignal() {
  sigset_t set = TerminationSignals();
  int signal = 0;
  while (sigwait(&set, &signal) != 0) {
  }
  return signal;
}

struct TerminationSignalWatch::Shared {
  std::string program;
  absl::Mutex mu;
  std::string stage ABSL_GUARDED_BY(mu) = "starting";
  bool started ABSL_GUARDED_BY(mu) = false;
  int signal ABSL_GUARDED_BY(mu) = 0;
};

TerminationSignalWatch::TerminationSignalWatch(std::string program)
    : shared_(std::make_shared<Shared>()) {
  shared_->program = std::move(program);
  std::thread([shared = shared_] {
    const int signal = WaitForTerminationSignal();
    absl::MutexLock lock(&shared->mu);
    if (!shared->started) {
      std::fprintf(stderr, "%s: signal %d during start-up (%s): exiting\n",
                   shared->program.c_str(), signal, shared->stage.c_str());
      std::fflush(stderr);
      _exit(0);
    }
    shared->signal = signal;
  }).detach();
}

void TerminationSignalWatch::SetStage(std::string stage) {
  absl::MutexLock lock(&shared_->mu);
  shared_->stage = std::move(stage);
}

void TerminationSignalWatch::MarkStarted() {
  absl::MutexLock lock(&shared_->mu);
  shared_->started = true;
}

int TerminationSignalWatch::Wait() {
  absl::MutexLock lock(&shared_->mu);
  shared_->mu.Await(absl::Condition(
      +[](Shared* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->signal != 0; },
      shared_.get()));
  return shared_->signal;
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& address,
                                           const std::optional<ExpectedServer>& expect) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_ENABLE_HTTP_PROXY, 0);
  args.SetMaxReceiveMessageSize(kMaxMessageBytes);
  AddClientKeepalive(args);
  return grpc::CreateCustomChannel(address, MakeChannelCredentials(ProcessSecurity(), expect),
                                   args);
}

std::shared_ptr<grpc::Channel> MakeCoordinatorChannel(const std::string& address) {
  return MakeChannel(address, ExpectedServer{Role::kCoordinator, ""});
}

std::shared_ptr<grpc::Channel> MakeWorkerChannel(const std::string& address,
                                                 const std::string& host) {
  return MakeChannel(address, ExpectedServer{Role::kWorker, host});
}

std::unique_ptr<grpc::ClientContext> ContextWithTimeout(absl::Duration timeout) {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return context;
}

}  // namespace meshrun::services
