// Distributing one 256 MiB executable to 2 workers over loopback, all in this process:
//   meshrun   the coordinator's path: an ExecutableCache entry streamed by
//             services::SendExecutable (as JobLauncher does), each 1 MiB chunk read from the
//             cache file into the buffer gRPC sends with its CRC-32C, to two real WorkerServers,
//             whose upload thread checks each chunk's CRC and appends it to a temp file while
//             the next arrives (the sha256 waits for the load, bench/README.md "Integrity");
//             on the last one they check the length and acknowledge. Timed until both
//             acknowledged, as JobLauncher waits; the stores' flushers then make the files
//             durable, and the bench waits for that, untimed, before the next transfer.
//   grpc      the same bytes, from memory, in 1 MiB chunks (same message type, same channel
//             options) to two bare servers in this process whose LoadExecutable reads and
//             discards each chunk.
// Both send to the two workers at once (a thread each), as JobLauncher does. Rounds alternate
// which path goes first; between rounds the workers' stores are emptied so every round
// transfers everything. Figures are medians over rounds; MB = 10^6 bytes.
//
// Also prints the process CPU time of each path (client and servers share this process), and
// the worker-side steps alone over the same bytes on one thread (sha256, write + fsync, the
// cache's pread), which show where the meshrun path's time goes.
//
// Prints absolute MB/s of both, then as its last line (higher is better):
//   ratio distribution_vs_grpc <median over rounds of meshrun MB/s / grpc MB/s in that round>
//
// Usage: meshrun_distribution_bench [--mib N] [--rounds R] [--dir DIR]
#include <stdlib.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "bench/bench_tls.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_support.h"
#include "common/mutex_checks.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "coordinator/executable_cache.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "coordinator_service/executable_transfer.h"
#include "rpc/server_support.h"
#include "worker_service/worker_server.h"
#include "spdlog/spdlog.h"

namespace {

using meshrun::bench::Fail;
using meshrun::bench::Median;
using meshrun::bench::Now;

using namespace meshrun;
constexpr size_t kChunk = 1 << 20;

double CpuNow() {  // this process, all threads (client and servers alike)
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

absl::Status FromGrpc(const grpc::Status& s) {
  return s.ok() ? absl::OkStatus()
                : absl::Status(static_cast<absl::StatusCode>(s.error_code()), s.error_message());
}

// The baseline server: reads every chunk of a LoadExecutable stream and drops it.
class DiscardService final : public v1::Worker::CallbackService {
 public:
  grpc::ServerReadReactor<v1::LoadExecutableChunk>* LoadExecutable(
      grpc::CallbackServerContext*, v1::LoadExecutableResponse* response) override {
    class Reactor final : public grpc::ServerReadReactor<v1::LoadExecutableChunk> {
     public:
      explicit Reactor(v1::LoadExecutableResponse* response) : response_(response) {
        StartRead(&chunk_);
      }
      void OnReadDone(bool ok) override {
        if (!ok) {
          response_->set_bytes_received(received_);
          return Finish(grpc::Status::OK);
        }
        received_ += static_cast<int64_t>(chunk_.data().size());
        StartRead(&chunk_);
      }
      void OnDone() override { delete this; }

     private:
      v1::LoadExecutableResponse* const response_;
      v1::LoadExecutableChunk chunk_;
      int64_t received_ = 0;
    };
    return new Reactor(response);
  }
};

// The baseline client: the same bytes from memory, 1 MiB per message, nothing else.
absl::Status SendPlain(v1::Worker::Stub& stub, const std::string& bytes) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(120)));
  v1::LoadExecutableResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::LoadExecutableChunk>> writer =
      stub.LoadExecutable(&context, &response);
  bool ok = true;
  for (size_t offset = 0; ok && offset < bytes.size(); offset += kChunk) {
    v1::LoadExecutableChunk chunk;
    chunk.set_data(bytes.data() + offset, std::min(kChunk, bytes.size() - offset));
    ok = writer->Write(chunk);
  }
  writer->WritesDone();
  if (absl::Status finished = FromGrpc(writer->Finish()); !finished.ok()) return finished;
  if (!ok) return absl::UnavailableError("server closed the stream");
  if (response.bytes_received() != static_cast<int64_t>(bytes.size())) {
    return absl::InternalError("bare server received a different byte count");
  }
  return absl::OkStatus();
}

// Runs `send(i)` for i < 2 (the two receivers) at once, one thread each; the first error wins.
absl::Status ToBoth(const std::function<absl::Status(size_t)>& send) {
  absl::Status results[2];
  std::thread other([&] { results[1] = send(1); });
  results[0] = send(0);
  other.join();
  RETURN_IF_ERROR(results[0]);
  return results[1];
}

}  // namespace

int main(int argc, char** argv) {
  meshrun::ConfigureMutexDeadlockDetection();
  int64_t mib = 256;
  int rounds = 15;
  std::string parent = std::filesystem::temp_directory_path().string();
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
      mib = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
      parent = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--mib N] [--rounds R] [--dir DIR]\n", argv[0]);
      return 2;
    }
  }
  if (mib < 1 || rounds < 1) {
    std::fprintf(stderr, "distribution_bench: --mib and --rounds must be >= 1\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::err);  // the workers retry registering with no coordinator

  std::string templ = parent + "/meshrun_distribution_bench.XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    std::fprintf(stderr, "distribution_bench: cannot create a directory under %s\n", parent.c_str());
    return 1;
  }
  const std::string dir = templ;
  if (absl::Status tls = bench::MaybeEnableTls(dir, "coordinator"); !tls.ok()) {
    std::fprintf(stderr, "distribution_bench: %s\n", std::string(tls.message()).c_str());
    return 1;
  }
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};

  // The artifact: pseudo-random bytes (incompressible), stored in the coordinator's cache.
  std::string bytes(static_cast<size_t>(mib) << 20, '\0');
  uint64_t x = 0x9E3779B97F4A7C15ULL;
  for (size_t i = 0; i + 8 <= bytes.size(); i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(bytes.data() + i, &x, 8);
  }
  auto cache = coordinator::ExecutableCache::Create({.directory = dir + "/cache"});
  if (!cache.ok()) return Fail("cache", cache.status());
  const std::string key = Sha256Hex("meshrun distribution bench");
  if (absl::Status s = (*cache)->Insert(key, bytes); !s.ok()) return Fail("cache insert", s);
  auto entry = (*cache)->Lookup(key);
  if (!entry.ok() || !entry->has_value()) return Fail("cache lookup", entry.status());
  const coordinator::CachedExecutable& executable = **entry;

  // Two real workers (no runtime, no coordinator: only their LoadExecutable is used).
  std::vector<std::unique_ptr<services::WorkerServer>> workers;
  std::vector<std::shared_ptr<grpc::Channel>> worker_channels;
  for (int w = 0; w < 2; ++w) {
    services::WorkerServer::Config config;
    config.listen = "127.0.0.1:0";
    config.coordinator = "127.0.0.1:1";  // nothing listens: registration just keeps retrying
    config.identity.host = absl::StrCat("bench-worker-", w);
    config.state_dir = absl::StrCat(dir, "/worker", w);
    config.rpc_timeout = absl::Seconds(1);
    auto worker = services::WorkerServer::Start(config);
    if (!worker.ok()) return Fail("start worker", worker.status());
    worker_channels.push_back(services::MakeChannel(absl::StrCat("127.0.0.1:", (*worker)->port())));
    workers.push_back(std::move(*worker));
  }
  // Two bare servers.
  DiscardService discard;
  std::vector<std::unique_ptr<grpc::Server>> bare;
  std::vector<std::unique_ptr<v1::Worker::Stub>> bare_stubs;
  for (int b = 0; b < 2; ++b) {
    int port = 0;
    grpc::ServerBuilder builder;
    builder.AddListeningPort(
        "127.0.0.1:0", *services::MakeServerCredentials(services::ProcessSecurity()), &port);
    builder.RegisterService(&discard);
    bare.push_back(builder.BuildAndStart());
    if (bare.back() == nullptr || port == 0) {
      std::fprintf(stderr, "distribution_bench: cannot start the bare server\n");
      return 1;
    }
    bare_stubs.push_back(v1::Worker::NewStub(services::MakeChannel(absl::StrCat("127.0.0.1:", port))));
  }
  auto clear_stores = [&] {
    for (int w = 0; w < 2; ++w) {
      std::error_code ec;
      for (const auto& f : std::filesystem::directory_iterator(
               absl::StrCat(dir, "/worker", w, "/executables"), ec)) {
        std::filesystem::remove(f.path(), ec);
      }
    }
  };
  auto run_meshrun = [&]() -> absl::StatusOr<double> {
    clear_stores();
    const double start = Now();
    RETURN_IF_ERROR(
        ToBoth([&](size_t i) { return services::SendExecutable(worker_channels[i], executable); }));
    const double seconds = Now() - start;
    // Untimed: the stores' flushers make the executable durable under its final name; waiting
    // for them keeps their disk work out of the next timed transfer.
    for (int w = 0; w < 2; ++w) {
      const std::string stored =
          absl::StrCat(dir, "/worker", w, "/executables/", executable.sha256(), ".xexe");
      for (int i = 0; i < 6000 && !std::filesystem::exists(stored); ++i) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      if (!std::filesystem::exists(stored)) {
        return absl::InternalError(absl::StrCat("worker ", w, " did not store the executable"));
      }
    }
    return seconds;
  };
  auto run_grpc = [&]() -> absl::StatusOr<double> {
    const double start = Now();
    RETURN_IF_ERROR(ToBoth([&](size_t i) { return SendPlain(*bare_stubs[i], bytes); }));
    return Now() - start;
  };

  const double total_mb = 2.0 * static_cast<double>(bytes.size()) / 1e6;
  std::printf("artifact %lld MiB (sha256 %s...), 2 workers on loopback, 1 MiB chunks, %d rounds; "
              "state under %s\n",
              static_cast<long long>(mib), executable.sha256().substr(0, 12).c_str(), rounds,
              dir.c_str());
  // Warm-up: one transfer each (connections, allocator, page cache).
  if (auto s = run_meshrun(); !s.ok()) return Fail("meshrun warm-up", s.status());
  if (auto s = run_grpc(); !s.ok()) return Fail("grpc warm-up", s.status());
  std::vector<double> meshrun_mbs, grpc_mbs, paired, meshrun_cpu, grpc_cpu;
  for (int round = 0; round < rounds; ++round) {
    double m = 0, g = 0;
    for (int k = 0; k < 2; ++k) {
      const bool meshrun_now = (k + round) % 2 == 0;
      const double cpu_start = CpuNow();
      absl::StatusOr<double> seconds = meshrun_now ? run_meshrun() : run_grpc();
      const double cpu = CpuNow() - cpu_start;  // meshrun's includes emptying the stores
      if (!seconds.ok()) return Fail(meshrun_now ? "meshrun" : "grpc", seconds.status());
      (meshrun_now ? m : g) = total_mb / *seconds;
      (meshrun_now ? meshrun_cpu : grpc_cpu).push_back(cpu);
    }
    meshrun_mbs.push_back(m);
    grpc_mbs.push_back(g);
    paired.push_back(m / g);
    std::printf("round %d: meshrun %.0f MB/s, grpc %.0f MB/s\n", round + 1, m, g);
    std::fflush(stdout);
  }
  clear_stores();
  const double m = Median(meshrun_mbs), g = Median(grpc_mbs);
  std::printf("meshrun (cache -> LoadExecutable -> CRC-32C + store): median %.0f MB/s "
              "(%.2f s for both workers)\n", m, total_mb / m);
  std::printf("plain gRPC client stream to a discarding server:    median %.0f MB/s "
              "(%.2f s for both workers)\n", g, total_mb / g);
  std::printf("meshrun MB/s %s\n", bench::Spread(meshrun_mbs, 0).c_str());
  std::printf("grpc MB/s    %s\n", bench::Spread(grpc_mbs, 0).c_str());
  std::printf("per-round meshrun/grpc %s; ratio of medians %.4f\n",
              bench::Spread(paired).c_str(), m / g);
  std::vector<double> cpu_ratios;  // less sensitive than wall time to a loaded machine
  for (size_t i = 0; i < meshrun_cpu.size(); ++i) cpu_ratios.push_back(grpc_cpu[i] / meshrun_cpu[i]);
  std::printf("process CPU per distribution (client + servers): meshrun median %.2f s, grpc "
              "median %.2f s; per-round grpc/meshrun CPU %s\n", Median(meshrun_cpu),
              Median(grpc_cpu), bench::Spread(cpu_ratios).c_str());

  // Where the time goes: the worker-side steps alone, single thread, over the same bytes.
  {
    double t = Now();
    Sha256 hasher;
    for (size_t off = 0; off < bytes.size(); off += kChunk) {
      hasher.Update(absl::string_view(bytes).substr(off, kChunk));
    }
    const std::string digest = hasher.HexDigest();
    const double sha_mbs = bytes.size() / 1e6 / (Now() - t);
    const std::string path = dir + "/write_probe";
    const double write_start = Now();
    FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr) return Fail("write probe", absl::InternalError(path));
    for (size_t off = 0; off < bytes.size(); off += kChunk) {
      std::fwrite(bytes.data() + off, 1, std::min(kChunk, bytes.size() - off), f);
    }
    std::fflush(f);
    const double written = Now();
    fsync(fileno(f));
    std::fclose(f);
    const double synced = Now();
    std::filesystem::remove(path);
    t = Now();
    uint64_t read = 0;
    if (absl::Status s = executable.ForEachChunk(kChunk, [&](absl::string_view piece) {
          read += piece.size();
          return absl::OkStatus();
        });
        !s.ok()) {
      return Fail("cache read probe", s);
    }
    const double read_mbs = read / 1e6 / (Now() - t);
    std::printf("components, one worker's share (%lld MiB, one thread): sha256 %.0f MB/s%s; "
                "write to page cache %.0f MB/s + fsync %.2f s (write+fsync %.0f MB/s); cache "
                "pread %.0f MB/s\n",
                static_cast<long long>(mib), sha_mbs,
                digest == executable.sha256() ? "" : " (DIGEST MISMATCH)",
                bytes.size() / 1e6 / (written - write_start), synced - written,
                bytes.size() / 1e6 / (synced - write_start), read_mbs);
  }
  for (auto& worker : workers) worker->Drain(absl::Seconds(1));
  for (auto& server : bare) server->Shutdown();
  std::printf("ratio distribution_vs_grpc %.4f\n", Median(paired));
  return 0;
}
