// Fan-out of one job's summaries to 500 watchers over loopback, all in this process:
//   meshrun   the coordinator's path: one host streams summaries with the worker's uploader
//             (TelemetryUploader -> UploadTelemetry) into a real CoordinatorServer, which
//             validates, combines, commits them to its SQLite history and fans them out through
//             the watch hub to 500 WatchTelemetryBatches streams (a watcher that is behind gets
//             what is queued for it in one message).
//   grpc      a bare gRPC server of the same service whose WatchTelemetryBatches streams hold a
//             queue of shared summaries each and write one summary per message, as a naive
//             per-stream server does; the publisher hands every summary (the same messages)
//             straight to the 500 streams.
// Both are read by the same client code (tests/watch_fleet.h: callback readers on 4 channels)
// and driven the same way: summaries are published as fast as the slowest watcher allows, at
// most `--window` ahead of it (below the coordinator's per-watcher queue, so nobody overflows).
// Throughput = deliveries (summaries x watchers) per second from the second publish until every
// watcher holds every summary (step 1 goes alone and untimed: it sets up the publisher's
// connection); latency = publish to receive, per delivery.
//
// Prints absolute figures of both, then as its last line (higher is better):
//   ratio fanout_vs_grpc <median over rounds of meshrun deliveries/s / grpc deliveries/s>
//
// Rounds alternate which path goes first; figures are medians over rounds, with the spread of
// the per-round ratios. Then `--paced_rounds` alternating runs of each at a steady
// `--paced_rate` for 10 s report latency below saturation (with the window, the throughput
// runs' latency is mostly queueing).
//
// With `--paced_only 1` it runs only the paced rounds and prints as its last line:
//   ratio p99_at_<rate>hz_vs_grpc <median over rounds of grpc p99 / meshrun p99>
//
// With `--tls_vs_plain 1` it instead runs the meshrun path in plaintext and with mutual TLS on
// every link (the coordinator's certificate and the access policy; the uploader presents a
// worker certificate, checked for its host and job membership; the watchers a view
// certificate and check the coordinator's), and prints as its last line:
//   ratio fanout_tls_vs_plain <median over rounds of TLS deliveries/s / plaintext deliveries/s>
// (9 rounds unless --rounds says otherwise: the goal is judged on the median of at least 9
// rounds with its IQR, printed on the line above).
//
// Usage: meshrun_fanout_bench [--watchers 500] [--summaries 1000] [--window 256] [--rounds 5]
//                             [--paced_rate 20] [--paced_rounds 3] [--paced_only 0|1]
//                             [--tls_vs_plain 0|1]
//                             (--rounds: 5, or 9 with --tls_vs_plain 1)
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <deque>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_support.h"
#include "common/mutex_checks.h"
#include "common/status_macros.h"
#include "rpc/cert_authority.h"
#include "coordinator_service/coordinator_server.h"
#include "rpc/server_support.h"
#include "worker_service/telemetry_uploader.h"
#include "tests/watch_fleet.h"

namespace meshrun::bench {
namespace {

// The baseline: WatchTelemetryBatches streams fed directly from memory, one summary per message
// (each published summary is wrapped once, as a batch of one, and shared by every stream).
class BareFanout final : public v1::Coordinator::CallbackService {
 public:
  class Stream final : public grpc::ServerWriteReactor<v1::GlobalSummaryBatch> {
   public:
    explicit Stream(BareFanout* owner) : owner_(owner) {}
    void Push(std::shared_ptr<const v1::GlobalSummaryBatch> summary) {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      queue_.push_back(std::move(summary));
      if (!writing_) WriteNextLocked();
    }
    void End() {
      absl::MutexLock lock(&mu_);
      ending_ = true;
      if (!writing_ && queue_.empty()) FinishLocked(grpc::Status::OK);
    }
    void OnWriteDone(bool ok) override {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      if (!ok) return FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "gone"));
      if (!queue_.empty()) return WriteNextLocked();
      if (ending_) FinishLocked(grpc::Status::OK);
    }
    void OnDone() override {
      owner_->Remove(this);
      delete this;
    }

   private:
    void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      StartWrite(current_.get());
    }
    void FinishLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      if (finished_) return;
      finished_ = true;
      queue_.clear();
      Finish(status);
    }
    BareFanout* const owner_;
    absl::Mutex mu_;
    std::deque<std::shared_ptr<const v1::GlobalSummaryBatch>> queue_ ABSL_GUARDED_BY(mu_);
    std::shared_ptr<const v1::GlobalSummaryBatch> current_ ABSL_GUARDED_BY(mu_);
    bool writing_ ABSL_GUARDED_BY(mu_) = false;
    bool ending_ ABSL_GUARDED_BY(mu_) = false;
    bool finished_ ABSL_GUARDED_BY(mu_) = false;
  };

  grpc::ServerWriteReactor<v1::GlobalSummaryBatch>* WatchTelemetryBatches(
      grpc::CallbackServerContext*, const v1::WatchTelemetryRequest*) override {
    auto* stream = new Stream(this);
    absl::MutexLock lock(&mu_);
    streams_.insert(stream);
    return stream;
  }
  int Streams() {
    absl::MutexLock lock(&mu_);
    return streams_.size();
  }
  void Publish(const std::shared_ptr<const v1::GlobalSummaryBatch>& summary) {
    absl::MutexLock lock(&mu_);
    for (Stream* stream : streams_) stream->Push(summary);
  }
  void EndAll() {
    absl::MutexLock lock(&mu_);
    for (Stream* stream : streams_) stream->End();
  }

 private:
  void Remove(Stream* stream) {
    absl::MutexLock lock(&mu_);
    streams_.erase(stream);
  }
  absl::Mutex mu_;
  std::set<Stream*> streams_ ABSL_GUARDED_BY(mu_);
};

struct Figures {
  double deliveries_per_second = 0;
  double cpu_micros_per_delivery = 0;  // whole process (server and clients): robust to load
  double p50_ms = 0, p99_ms = 0;
  double summaries_per_message = 0;  // batching: 1 when every summary came alone
  double first_delivery_ms = 0;      // step 1, untimed: includes the publisher's connection
};

struct Options {
  int watchers = 500;
  int64_t summaries = 1000;
  int64_t window = 256;
  int rounds = 0;  // 0: 5, or kTlsRounds with tls_vs_plain
  double rate = 0;        // summaries/s; 0 = as fast as the window allows
  double paced_rate = 20;  // the latency runs' rate (0: skip them)
  int paced_rounds = 3;
  bool paced_only = false;
  bool tls_vs_plain = false;
};

// Mutual TLS for one meshrun run: certificates from a throw-away CA under `dir`.
struct TlsSetup {
  services::SecurityConfig coordinator;
  std::shared_ptr<grpc::ChannelCredentials> uploader, watchers;
};

absl::StatusOr<TlsSetup> MakeTls(const std::string& dir, const std::string& host) {
  const std::string ca = dir + "/tls-ca";
  RETURN_IF_ERROR(services::CreateClusterCa(ca, "bench", 1));
  const auto issue = [&](const std::string& role, const std::string& name) {
    return services::IssueCertificate({.ca_dir = ca, .role = role, .name = name}).status();
  };
  RETURN_IF_ERROR(issue("coordinator", "coordinator"));
  RETURN_IF_ERROR(issue("worker", host));
  RETURN_IF_ERROR(issue("view", "dashboard"));
  const auto config = [&](const std::string& name) {
    return services::SecurityConfig{.tls_cert = ca + "/" + name + ".pem",
                                    .tls_key = ca + "/" + name + ".key",
                                    .tls_ca = ca + "/ca.pem"};
  };
  const services::ExpectedServer coordinator{services::Role::kCoordinator, ""};
  return TlsSetup{.coordinator = config("coordinator"),
                  .uploader = services::MakeChannelCredentials(config(host), coordinator),
                  .watchers = services::MakeChannelCredentials(config("dashboard"), coordinator)};
}

// Publishes `summaries` with `publish(step)`, at most `window` ahead of the slowest watcher,
// and measures until every watcher holds them all; `end` then closes the streams. Step 1 goes
// alone and untimed (Figures::first_delivery_ms): its delivery includes setting up the
// publisher's connection, and with mutual TLS gRPC 1.51 can hold the first call on a new
// connection made after the watchers' burst of streams for ~1 s (bench/README.md), which would
// otherwise decide the run.
template <typename Publish, typename End>
absl::StatusOr<Figures> Drive(const Options& options, test_support::WatchFleet& fleet,
                              Publish publish, End end) {
  const double first_start = Now();
  publish(1);
  if (!fleet.AwaitReceived(1, absl::Seconds(30))) {
    return absl::DeadlineExceededError("step 1 did not reach every watcher in 30 s");
  }
  const double first_delivery_ms = (Now() - first_start) * 1e3;
  const double start = Now(), cpu_start = ProcessCpuSeconds();
  for (int64_t step = 2; step <= options.summaries; ++step) {
    while (step - fleet.MinReceived() > options.window) absl::SleepFor(absl::Microseconds(200));
    if (options.rate > 0) {
      absl::SleepFor(absl::Seconds((step - 2) / options.rate - (Now() - start)));
    }
    publish(step);
  }
  if (!fleet.AwaitReceived(options.summaries, absl::Minutes(2))) {
    return absl::DeadlineExceededError(absl::StrCat("the slowest watcher has ",
                                                    fleet.MinReceived(), " summaries"));
  }
  const double elapsed = Now() - start, cpu = ProcessCpuSeconds() - cpu_start;
  end();
  if (!fleet.AwaitDone(absl::Minutes(1))) return absl::DeadlineExceededError("streams not ended");
  for (const auto& reader : fleet.readers()) {
    if (!reader->status.ok() || reader->breaks != 0 || reader->received != options.summaries) {
      return absl::InternalError(absl::StrCat("a watcher got ", reader->received.load(),
                                              " summaries, ", reader->breaks, " breaks: ",
                                              reader->status.error_message()));
    }
  }
  const double deliveries = (options.summaries - 1) * options.watchers;  // timed
  int64_t messages = 0;
  for (const auto& reader : fleet.readers()) messages += reader->messages;
  return Figures{.deliveries_per_second = deliveries / elapsed,
                 .cpu_micros_per_delivery = cpu * 1e6 / deliveries,
                 .p50_ms = fleet.LatencyPercentile(50) / 1e3,
                 .p99_ms = fleet.LatencyPercentile(99) / 1e3,
                 .summaries_per_message =
                     static_cast<double>(options.summaries * options.watchers) / messages,
                 .first_delivery_ms = first_delivery_ms};
}

test_support::WatchFleet::Config FleetConfig(const Options& options, int port,
                                             const std::string& job) {
  v1::WatchTelemetryRequest request;
  request.set_job_id(job);
  request.set_since_step(1);
  return {.address = absl::StrCat("127.0.0.1:", port),
          .watchers = options.watchers,
          .channels = 4,
          .request = request,
          .expected_summaries = static_cast<size_t>(options.summaries)};
}

absl::Status AwaitCount(const std::function<int()>& count, int want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (count() < want) {
    if (absl::Now() > deadline) return absl::DeadlineExceededError("watchers did not subscribe");
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::OkStatus();
}

absl::StatusOr<Figures> RunGrpc(const Options& options) {
  BareFanout service;
  ASSIGN_OR_RETURN(services::StartedServer server,
                   services::StartGrpcServer("listen", "127.0.0.1:0", {&service}));
  absl::StatusOr<Figures> figures;
  {
    test_support::WatchFleet fleet(FleetConfig(options, server.port, "bare"));
    fleet.Start();
    RETURN_IF_ERROR(AwaitCount([&] { return service.Streams(); }, options.watchers));
    figures = Drive(
        options, fleet,
        [&](int64_t step) {
          auto batch = std::make_shared<v1::GlobalSummaryBatch>();
          v1::GlobalSummary* summary = batch->add_summaries();
          summary->set_job_id("bare");
          test_support::FillValues(*summary, step);
          service.Publish(batch);
        },
        [&] { service.EndAll(); });
  }
  services::DrainServer(*server.server, absl::Seconds(1));
  return figures;
}

absl::StatusOr<Figures> RunMeshrun(const Options& options, const std::string& dir,
                                   bool tls = false) {
  const std::string host = "bench-host";
  TlsSetup security;
  if (tls) {
    ASSIGN_OR_RETURN(security, MakeTls(dir, host));
  }
  services::SetProcessSecurity(security.coordinator);  // the server's; empty: plaintext
  services::CoordinatorServer::Config config{.listen = "127.0.0.1:0", .state_dir = dir};
  config.limits.max_watch_streams = 0;  // --watchers may pass the default cap of 1000
  // ... and every watcher is one view identity (one certificate), past its share of 100
  config.limits.max_watch_streams_per_identity = 0;
  absl::StatusOr<std::unique_ptr<services::CoordinatorServer>> started =
      services::CoordinatorServer::Start(config);
  services::SetProcessSecurity({});
  ASSIGN_OR_RETURN(std::unique_ptr<services::CoordinatorServer> server, std::move(started));
  // A job of the job table, so the uploads pass the membership check as a real job's would.
  const std::string job = server->jobs().Add(v1::JobSpec());
  v1::JobManifest manifest;
  manifest.set_job_id(job);
  (*manifest.mutable_host_incarnations())[host] = "incarnation-1";
  RETURN_IF_ERROR(server->jobs().Update(job, [&](v1::JobManifest& m) {
    *m.mutable_host_incarnations() = manifest.host_incarnations();
  }));
  manifest.mutable_mesh()->add_shape(1);
  for (const char* name : {"loss", "grad_norm", "sink_mass"}) {
    v1::TelemetryDeclaration* d = manifest.mutable_spec()->add_telemetry();
    d->set_name(name);
    d->set_combine(v1::COMBINE_MEAN);
    if (std::strcmp(name, "sink_mass") == 0) {
      d->add_shape(6);
      d->add_shape(4);
    }
  }
  services::CoordinatorTelemetry& telemetry = server->telemetry();
  RETURN_IF_ERROR(telemetry.DeclareJob(job, manifest.spec()));
  RETURN_IF_ERROR(telemetry.StartJob(manifest));
  absl::StatusOr<Figures> figures;
  {
    test_support::WatchFleet::Config fleet_config = FleetConfig(options, server->port(), job);
    fleet_config.credentials = security.watchers;
    test_support::WatchFleet fleet(fleet_config);
    fleet.Start();
    RETURN_IF_ERROR(
        AwaitCount([&] { return telemetry.hub().WatcherCount(job); }, options.watchers));
    services::TelemetryUploader uploader({.coordinator = absl::StrCat("127.0.0.1:", server->port()),
                                          .credentials = security.uploader});
    figures = Drive(
        options, fleet,
        [&](int64_t step) {
          v1::HostSummary summary;
          summary.set_job_id(job);
          summary.set_host(host);
          summary.set_incarnation("incarnation-1");
          summary.set_replica_count(1);
          test_support::FillValues(summary, step);
          uploader.Enqueue(std::move(summary));
        },
        [&] { telemetry.EndJob(job); });
  }
  return figures;
}

// Runs `run(path, dir)` for paths 0 and 1 in each of `rounds` rounds, alternating which goes
// first, and prints the medians of each under `names` and the spread of the per-round ratios
// (path 1 over path 0). Returns those ratios.
absl::StatusOr<std::vector<double>> Compare(
    const Options& options, const std::string& title, const std::array<const char*, 2>& names,
    const std::function<absl::StatusOr<Figures>(int path, const std::string& dir)>& run) {
  std::vector<double> rate[2], cpu[2], p50[2], p99[2], batch[2], first_delivery[2], ratios;
  for (int round = 0; round < options.rounds; ++round) {
    for (int i = 0; i < 2; ++i) {
      const int path = (round + i) % 2;
      const std::string dir =
          std::filesystem::temp_directory_path() /
          absl::StrCat("meshrun_fanout_bench_", getpid(), "_", round, "_", path);
      absl::StatusOr<Figures> f = run(path, dir);
      std::filesystem::remove_all(dir);
      if (!f.ok()) {
        return absl::Status(f.status().code(),
                            absl::StrCat(names[path], ": ", f.status().message()));
      }
      rate[path].push_back(f->deliveries_per_second);
      cpu[path].push_back(f->cpu_micros_per_delivery);
      p50[path].push_back(f->p50_ms);
      p99[path].push_back(f->p99_ms);
      batch[path].push_back(f->summaries_per_message);
      first_delivery[path].push_back(f->first_delivery_ms);
    }
    ratios.push_back(rate[1].back() / rate[0].back());
    std::printf("round %d: %s %.0f deliveries/s (cpu %.2f us, %.1f summaries/message), %s %.0f "
                "deliveries/s (cpu %.2f us, %.1f summaries/message): x%.3f; untimed first "
                "deliveries %.1f and %.1f ms\n",
                round + 1, names[0], rate[0].back(), cpu[0].back(), batch[0].back(), names[1],
                rate[1].back(), cpu[1].back(), batch[1].back(), ratios.back(),
                first_delivery[0].back(), first_delivery[1].back());
    std::fflush(stdout);
  }
  std::printf("%s: %d watchers, %lld summaries, window %lld, %d rounds (medians)\n", title.c_str(),
              options.watchers, static_cast<long long>(options.summaries),
              static_cast<long long>(options.window), options.rounds);
  for (int path = 0; path < 2; ++path) {
    std::printf("%-10s %12.0f deliveries/s  (%8.1f summaries/s)  cpu %5.2f us/delivery  "
                "latency p50 %7.2f ms  p99 %7.2f ms  %5.1f summaries/message\n",
                names[path], Median(rate[path]), Median(rate[path]) / options.watchers,
                Median(cpu[path]), Median(p50[path]), Median(p99[path]), Median(batch[path]));
  }
  std::printf("per-round %s/%s deliveries/s %s\n", names[1], names[0], Spread(ratios).c_str());
  return ratios;
}

int Main(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int64_t value = std::atoll(argv[i + 1]);
    if (flag == "--watchers") options.watchers = value;
    else if (flag == "--summaries") options.summaries = value;
    else if (flag == "--window") options.window = value;
    else if (flag == "--rounds") options.rounds = value;
    else if (flag == "--paced_rate") options.paced_rate = value;
    else if (flag == "--paced_rounds") options.paced_rounds = value;
    else if (flag == "--paced_only") options.paced_only = value != 0;
    else if (flag == "--tls_vs_plain") options.tls_vs_plain = value != 0;
    else return Fail("usage", absl::InvalidArgumentError(
                                  "flags: --watchers --summaries --window --rounds --paced_rate "
                                  "--paced_rounds --paced_only --tls_vs_plain"));
  }
  constexpr int kTlsRounds = 9;  // fanout_tls_vs_plain is judged on at least this many
  if (options.rounds == 0) options.rounds = options.tls_vs_plain ? kTlsRounds : 5;
  if (options.watchers < 1 || options.summaries < 2 || options.rounds < 1 ||
      options.paced_rate < 0 || options.paced_rounds < 1 || options.window < 1 ||
      options.window >= 1024) {
    return Fail("flags", absl::InvalidArgumentError(
                             "--watchers and --rounds >= 1, --summaries >= 2 (step 1 is "
                             "untimed), --paced_rate >= 0, 1 <= --window < 1024 (the "
                             "coordinator's per-watcher queue)"));
  }
  if (options.paced_only && options.paced_rate <= 0) {
    return Fail("flags", absl::InvalidArgumentError("--paced_only 1 needs --paced_rate > 0"));
  }
  if (options.tls_vs_plain) {  // the meshrun path in plaintext and with mutual TLS
    absl::StatusOr<std::vector<double>> ratios = Compare(
        options, "fanout, meshrun path", {"plaintext", "mutualTLS"},
        [&](int path, const std::string& dir) { return RunMeshrun(options, dir, path == 1); });
    if (!ratios.ok()) return Fail("fanout", ratios.status());
    if (options.rounds < kTlsRounds) {
      std::printf("(%d rounds: fewer than the %d the goal is judged on)\n", options.rounds,
                  kTlsRounds);
    }
    std::printf("ratio fanout_tls_vs_plain %.3f\n", Median(*ratios));
    return 0;
  }
  // Rounds alternate which path goes first; figures are medians over rounds, and a round's
  // ratio compares the two runs of that round.
  // [0] grpc, [1] meshrun
  std::vector<double> rate[2], cpu[2], p50[2], p99[2], batch[2], first_delivery[2], ratios;
  auto run = [&](const Options& o, int path, const std::string& tag) -> absl::StatusOr<Figures> {
    const std::string dir = std::filesystem::temp_directory_path() /
                            absl::StrCat("meshrun_fanout_bench_", getpid(), "_", tag);
    absl::StatusOr<Figures> f = path == 0 ? RunGrpc(o) : RunMeshrun(o, dir);
    std::filesystem::remove_all(dir);
    return f;
  };
  if (options.paced_only) options.rounds = 0;
  std::printf("fanout: %d watchers, %lld summaries, window %lld, %d rounds\n", options.watchers,
              static_cast<long long>(options.summaries), static_cast<long long>(options.window),
              options.rounds);
  for (int round = 0; round < options.rounds; ++round) {
    for (int i = 0; i < 2; ++i) {
      const int path = (round + i) % 2;
      absl::StatusOr<Figures> f = run(options, path, absl::StrCat(round));
      if (!f.ok()) return Fail(path == 0 ? "grpc" : "meshrun", f.status());
      rate[path].push_back(f->deliveries_per_second);
      cpu[path].push_back(f->cpu_micros_per_delivery);
      p50[path].push_back(f->p50_ms);
      p99[path].push_back(f->p99_ms);
      batch[path].push_back(f->summaries_per_message);
      first_delivery[path].push_back(f->first_delivery_ms);
    }
    ratios.push_back(rate[1].back() / rate[0].back());
    std::printf("round %d: grpc %.0f deliveries/s (cpu %.2f us), meshrun %.0f deliveries/s "
                "(cpu %.2f us, %.1f summaries/message): x%.3f; untimed first deliveries %.1f "
                "and %.1f ms\n",
                round + 1, rate[0].back(), cpu[0].back(), rate[1].back(), cpu[1].back(),
                batch[1].back(), ratios.back(), first_delivery[0].back(),
                first_delivery[1].back());
    std::fflush(stdout);
  }
  for (int path = 0; path < 2 && !options.paced_only; ++path) {
    std::printf("%-8s %12.0f deliveries/s  (%8.1f summaries/s)  cpu %5.2f us/delivery  "
                "latency p50 %7.2f ms  p99 %7.2f ms  %5.1f summaries/message (medians)\n",
                path == 0 ? "grpc" : "meshrun", Median(rate[path]),
                Median(rate[path]) / options.watchers, Median(cpu[path]), Median(p50[path]),
                Median(p99[path]), Median(batch[path]));
  }
  if (!options.paced_only) {
    std::printf("deliveries/s: grpc %s\n", Spread(rate[0], 0).c_str());
    std::printf("deliveries/s: meshrun %s\n", Spread(rate[1], 0).c_str());
  }
  // Latency below saturation: the same fan-out at a steady rate both sustain, alternating.
  if (options.paced_rate > 0) {
    Options paced = options;
    paced.rate = options.paced_rate;
    paced.summaries = static_cast<int64_t>(10 * options.paced_rate);  // 10 s
    std::vector<double> paced_p50[2], paced_p99[2];
    for (int round = 0; round < options.paced_rounds; ++round) {
      for (int i = 0; i < 2; ++i) {
        const int path = (round + i) % 2;
        absl::StatusOr<Figures> f = run(paced, path, absl::StrCat("paced", round));
        if (!f.ok()) return Fail(path == 0 ? "grpc paced" : "meshrun paced", f.status());
        paced_p50[path].push_back(f->p50_ms);
        paced_p99[path].push_back(f->p99_ms);
      }
    }
    std::printf("paced at %.0f summaries/s for 10 s, %d rounds: latency grpc p50 %.2f ms, p99 "
                "%s ms\n", paced.rate, options.paced_rounds, Median(paced_p50[0]),
                Spread(paced_p99[0], 2).c_str());
    std::printf("paced at %.0f summaries/s: latency meshrun p50 %.2f ms, p99 %s ms\n",
                paced.rate, Median(paced_p50[1]), Spread(paced_p99[1], 2).c_str());
    if (options.paced_only) {
      std::vector<double> p99_ratios;
      for (int round = 0; round < options.paced_rounds; ++round) {
        p99_ratios.push_back(paced_p99[0][round] / paced_p99[1][round]);
      }
      std::printf("per-round grpc/meshrun p99 %s\n", Spread(p99_ratios).c_str());
      std::printf("ratio p99_at_%.0fhz_vs_grpc %.3f\n", paced.rate, Median(p99_ratios));
      return 0;
    }
  }
  std::printf("per-round meshrun/grpc deliveries/s %s\n", Spread(ratios).c_str());
  std::printf("ratio fanout_vs_grpc %.3f\n", Median(ratios));
  return 0;
}

}  // namespace
}  // namespace meshrun::bench

int main(int argc, char** argv) {
  meshrun::ConfigureMutexDeadlockDetection();
  return meshrun::bench::Main(argc, argv);
}
