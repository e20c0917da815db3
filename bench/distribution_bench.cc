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
// which path goes first; between rounds the workers' stores are emptied, and every meshrun
// transfer sends a new executable (its first 8 bytes count the transfers, as if freshly
// compiled): a worker refuses an upload of one it holds. Figures are medians over rounds;
// MB = 10^6 bytes.
//
// Also prints the process CPU time of each path while it is timed (client and servers share
// this process), and the worker-side steps alone over the same bytes on one thread (sha256,
// write + fsync, the cache's pread), which show where the meshrun path's time goes.
//
// Prints absolute MB/s of both, then as its last line (higher is better):
//   ratio distribution_vs_grpc <median over rounds of meshrun MB/s / grpc MB/s in that round>
//
// With `--tls_vs_ceiling 1` it instead runs the meshrun path in plaintext and with mutual TLS
// (two more WorkerServers serving TLS, the client presenting a coordinator certificate),
// alternating round by round, measures in every round the CPU cost of the TLS record cipher
// over the bytes moved (CipherSeconds), and compares the TLS throughput with the ceiling that
// the plaintext path and the cipher allow (see TlsCeiling), ending with
//   ratio distribution_tls_vs_ceiling <median over rounds of TLS MB/s / ceiling MB/s>
//
// Usage: meshrun_distribution_bench [--mib N] [--rounds R] [--dir DIR] [--tls_vs_ceiling 0|1]
#include <sched.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <openssl/evp.h>
#include <openssl/ssl.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_support.h"
#include "bench/bench_tls.h"
#include "common/mutex_checks.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "coordinator/executable_cache.h"
#include "coordinator_service/executable_transfer.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "rpc/server_support.h"
#include "spdlog/spdlog.h"
#include "worker_service/worker_server.h"

namespace {

using meshrun::bench::Fail;
using meshrun::bench::Median;
using meshrun::bench::Now;
using meshrun::bench::ProcessCpuSeconds;
using meshrun::bench::Spread;
using meshrun::bench::ThreadCpuSeconds;

using namespace meshrun;
constexpr size_t kChunk = 1 << 20;

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

// Two real workers (no runtime, no coordinator: only their LoadExecutable is used), serving
// with the process's security as it is when Start runs (WorkerServer reads it only there), and
// channels to them made with the same security.
struct Receivers {
  std::string dir;  // worker w's state lies in <dir>/worker<w>
  std::vector<std::unique_ptr<services::WorkerServer>> workers;
  std::vector<std::shared_ptr<grpc::Channel>> channels;

  ~Receivers() {
    for (auto& worker : workers) worker->Drain(absl::Seconds(1));
  }
  // Deletes the stored executables' files (the stores still list them; the bench never sends
  // one twice), so every transfer writes into a directory as empty as the first one's.
  void ClearStores() const {
    for (size_t w = 0; w < workers.size(); ++w) {
      std::error_code ec;
      const std::string store = absl::StrCat(dir, "/worker", w, "/executables");
      for (const auto& f : std::filesystem::directory_iterator(store, ec)) {
        std::filesystem::remove(f.path(), ec);
      }
    }
  }
};

absl::StatusOr<std::unique_ptr<Receivers>> StartReceivers(const std::string& dir) {
  auto receivers = std::make_unique<Receivers>();
  receivers->dir = dir;
  for (int w = 0; w < 2; ++w) {
    services::WorkerServer::Config config;
    config.listen = "127.0.0.1:0";
    config.coordinator = "127.0.0.1:1";  // nothing listens: registration just keeps retrying
    config.identity.host = absl::StrCat("bench-worker-", w);
    config.state_dir = absl::StrCat(dir, "/worker", w);
    config.rpc_timeout = absl::Seconds(1);
    ASSIGN_OR_RETURN(std::unique_ptr<services::WorkerServer> worker,
                     services::WorkerServer::Start(config));
    receivers->channels.push_back(
        services::MakeChannel(absl::StrCat("127.0.0.1:", worker->port())));
    receivers->workers.push_back(std::move(worker));
  }
  return receivers;
}

struct Transfer {
  double seconds = 0;  // wall, until both workers acknowledged
  double cpu = 0;      // process CPU (every thread: sender, gRPC, workers) over the same span
};

// One meshrun transfer of `executable` to both receivers, timed; then, untimed, waits until
// both stores made it durable, so their disk work stays out of the next timed transfer.
absl::StatusOr<Transfer> SendToWorkers(const Receivers& receivers,
                                       const coordinator::CachedExecutable& executable) {
  receivers.ClearStores();
  const double cpu_start = ProcessCpuSeconds(), start = Now();
  RETURN_IF_ERROR(ToBoth(
      [&](size_t i) { return services::SendExecutable(receivers.channels[i], executable); }));
  const Transfer transfer{.seconds = Now() - start, .cpu = ProcessCpuSeconds() - cpu_start};
  for (size_t w = 0; w < receivers.workers.size(); ++w) {
    const std::string stored = absl::StrCat(receivers.dir, "/worker", w, "/executables/",
                                            executable.sha256(), ".xexe");
    for (int i = 0; i < 6000 && !std::filesystem::exists(stored); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    if (!std::filesystem::exists(stored)) {
      return absl::InternalError(absl::StrCat("worker ", w, " did not store the executable"));
    }
  }
  return transfer;
}

// CPUs this process may run on (its affinity mask), the most it can keep busy.
int AvailableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return 1;
  return std::max(1, CPU_COUNT(&set));
}

// The AEAD of the TLS 1.3 suite gRPC's handshakes settle on here: gRPC 1.51 leaves OpenSSL's
// TLS 1.3 suites as they are (it sets only the TLS 1.2 cipher list) and both ends are this
// OpenSSL, so it is the first TLS 1.3 suite of a default context (on this machine
// TLS_AES_256_GCM_SHA384; checked in a handshake of this bench with gdb, bench/README.md).
// `suite` gets its name. Errors: INTERNAL when OpenSSL offers no TLS 1.3 AEAD it can run.
absl::StatusOr<const EVP_CIPHER*> NegotiatedAead(std::string* suite) {
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_method()), SSL_CTX_free);
  if (ctx == nullptr) return absl::InternalError("SSL_CTX_new failed");
  STACK_OF(SSL_CIPHER)* ciphers = SSL_CTX_get_ciphers(ctx.get());
  for (int i = 0; i < sk_SSL_CIPHER_num(ciphers); ++i) {
    const SSL_CIPHER* c = sk_SSL_CIPHER_value(ciphers, i);
    if (std::strcmp(SSL_CIPHER_get_version(c), "TLSv1.3") != 0) continue;
    const EVP_CIPHER* cipher = EVP_get_cipherbynid(SSL_CIPHER_get_cipher_nid(c));
    if (cipher == nullptr) continue;
    *suite = SSL_CIPHER_get_name(c);
    return cipher;
  }
  return absl::InternalError("no TLS 1.3 cipher suite in OpenSSL's defaults");
}

// CPU seconds (this thread) to seal and then open `total` bytes as TLS 1.3 records do with
// `cipher`: 16 KiB records (TLS's largest, the size gRPC's TLS writes fill), a fresh nonce per
// record (the IV XOR the record number), the 5-byte record header as associated data, the
// 16-byte tag made and checked. The plaintext comes from a 1 MiB window of `source` (as
// gRPC's TLS reads from the 1 MiB chunk it sends), so, like `openssl speed`, it measures the
// cipher itself with its data in cache: the cheapest the record encryption can be, which makes
// the ceiling built from it the highest. Errors: INTERNAL when OpenSSL refuses a call or a tag.
absl::StatusOr<double> CipherSeconds(const EVP_CIPHER* cipher, absl::string_view source,
                                     uint64_t total) {
  constexpr size_t kRecord = 16384, kTag = 16;
  const size_t window = std::min<size_t>(source.size(), kChunk);
  if (window < kRecord) return absl::InternalError("cipher source below one record");
  using Ctx = std::unique_ptr<EVP_CIPHER_CTX, decltype(&EVP_CIPHER_CTX_free)>;
  Ctx seal(EVP_CIPHER_CTX_new(), EVP_CIPHER_CTX_free);
  Ctx open(EVP_CIPHER_CTX_new(), EVP_CIPHER_CTX_free);
  unsigned char key[32], iv[12];  // both AEADs of TLS 1.3 take 12-byte nonces
  for (size_t i = 0; i < sizeof(key); ++i) key[i] = static_cast<unsigned char>(17 * i + 3);
  for (size_t i = 0; i < sizeof(iv); ++i) iv[i] = static_cast<unsigned char>(29 * i + 5);
  if (seal == nullptr || open == nullptr ||
      EVP_EncryptInit_ex(seal.get(), cipher, nullptr, key, iv) != 1 ||
      EVP_DecryptInit_ex(open.get(), cipher, nullptr, key, iv) != 1) {
    return absl::InternalError("cannot set up the cipher");
  }
  std::vector<unsigned char> sealed(kRecord + kTag), opened(kRecord + kTag);
  const auto* in = reinterpret_cast<const unsigned char*>(source.data());
  const double start = ThreadCpuSeconds();
  uint64_t record = 0;
  for (uint64_t done = 0; done < total; ++record) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kRecord, total - done));
    const unsigned char* plain = in + (record * kRecord) % (window - kRecord + 1);
    unsigned char nonce[12];
    std::memcpy(nonce, iv, sizeof(nonce));
    for (int b = 0; b < 8; ++b) nonce[11 - b] ^= static_cast<unsigned char>(record >> (8 * b));
    const unsigned char header[5] = {23, 3, 3, static_cast<unsigned char>((n + kTag) >> 8),
                                     static_cast<unsigned char>((n + kTag) & 0xff)};
    unsigned char tag[kTag];
    int len = 0, last = 0;
    bool ok = EVP_EncryptInit_ex(seal.get(), nullptr, nullptr, nullptr, nonce) == 1 &&
              EVP_EncryptUpdate(seal.get(), nullptr, &len, header, sizeof(header)) == 1 &&
              EVP_EncryptUpdate(seal.get(), sealed.data(), &len, plain, static_cast<int>(n)) == 1 &&
              EVP_EncryptFinal_ex(seal.get(), sealed.data() + len, &last) == 1 &&
              EVP_CIPHER_CTX_ctrl(seal.get(), EVP_CTRL_AEAD_GET_TAG, kTag, tag) == 1;
    ok = ok && EVP_DecryptInit_ex(open.get(), nullptr, nullptr, nullptr, nonce) == 1 &&
         EVP_DecryptUpdate(open.get(), nullptr, &len, header, sizeof(header)) == 1 &&
         EVP_DecryptUpdate(open.get(), opened.data(), &len, sealed.data(),
                           static_cast<int>(n)) == 1 &&
         EVP_CIPHER_CTX_ctrl(open.get(), EVP_CTRL_AEAD_SET_TAG, kTag, tag) == 1 &&
         EVP_DecryptFinal_ex(open.get(), opened.data() + len, &last) == 1;
    if (!ok) return absl::InternalError(absl::StrCat("cipher failed at record ", record));
    done += n;
  }
  const double seconds = ThreadCpuSeconds() - start;
  if (std::memcmp(opened.data(), in + ((record - 1) * kRecord) % (window - kRecord + 1),
                  static_cast<size_t>(total - (record - 1) * kRecord)) != 0) {
    return absl::InternalError("the opened record differs from the sealed one");
  }
  return seconds;
}

// The most TLS throughput the meshrun path could reach in a round, from that round's
// plaintext transfer (wall `plain.seconds`, process CPU `plain.cpu`) and the cipher's CPU
// seconds for the same bytes (`cipher_cpu`, sealing on the sender's side and opening on the
// receivers', from CipherSeconds):
//
//   busy    = min(cores, plain.cpu / plain.seconds)   the cores the plaintext path kept busy
//   ceiling = bytes / (plain.seconds + cipher_cpu / busy)
//
// Over TLS the path does all that plaintext does plus the records' cipher (everything else
// TLS adds, its framing, copies and handshakes, is left out: the ceiling grants them for free).
// Sender and receivers run on the same cores, so the cipher's CPU cannot hide behind the
// plaintext path's own work: on a machine it saturates (busy = cores, as here on 2 cores:
// plain.cpu ~ 2 x plain.seconds), every cipher CPU-second takes 1/cores seconds of wall time,
// and the ceiling is bytes x cores / (plain.cpu + cipher_cpu): the plaintext path's throughput
// scaled by its share of the CPU work TLS needs. Measuring `busy` instead of assuming the
// affinity's cores keeps the ceiling honest when neighbours took some of the cores in that
// round (the cipher gets the same share the plaintext path got), and when the path leaves a
// core idle by itself it assumes the cipher cannot use that idle time either (a stream's
// records are sealed in its write path, one write in flight). Returns MB/s (10^6 bytes).
double TlsCeiling(double bytes, const Transfer& plain, double cipher_cpu, int cores) {
  const double busy =
      std::clamp(plain.cpu / plain.seconds, 0.01, static_cast<double>(cores));  // 0.01: no 1/0
  return bytes / 1e6 / (plain.seconds + cipher_cpu / busy);
}

struct Options {
  int64_t mib = 256;
  int rounds = 15;
  std::string parent = std::filesystem::temp_directory_path().string();
  bool tls_vs_ceiling = false;
};

// --tls_vs_ceiling 1: the meshrun path in plaintext and with mutual TLS, against the ceiling.
int RunTlsVsCeiling(const Options& options, const std::string& dir, std::string& bytes,
                    const std::function<absl::StatusOr<coordinator::CachedExecutable>()>& next) {
  const int cores = AvailableCores();
  std::string suite;
  absl::StatusOr<const EVP_CIPHER*> cipher = NegotiatedAead(&suite);
  if (!cipher.ok()) return Fail("cipher", cipher.status());
  absl::StatusOr<services::SecurityConfig> tls = bench::MakeBenchTls(dir, "coordinator");
  if (!tls.ok()) return Fail("certificates", tls.status());
  auto plain = StartReceivers(dir + "/plain");
  if (!plain.ok()) return Fail("start plaintext workers", plain.status());
  // The TLS workers and their channels take the process's security while they start (the
  // only time WorkerServer::Start and MakeChannel read it); then it is plaintext again.
  services::SetProcessSecurity(*tls);
  auto secure = StartReceivers(dir + "/tls");
  services::SetProcessSecurity({});
  if (!secure.ok()) return Fail("start TLS workers", secure.status());

  const double total_bytes = 2.0 * static_cast<double>(bytes.size());
  std::printf("artifact %lld MiB to 2 workers on loopback, meshrun path in plaintext and with "
              "mutual TLS, %d rounds; TLS 1.3 %s, %d cores available\n",
              static_cast<long long>(options.mib), options.rounds, suite.c_str(), cores);
  auto transfer = [&](bool tls_now) -> absl::StatusOr<Transfer> {
    ASSIGN_OR_RETURN(coordinator::CachedExecutable executable, next());
    return SendToWorkers(tls_now ? **secure : **plain, executable);
  };
  for (bool tls_now : {false, true}) {  // warm-up: connections (handshakes), allocator
    if (auto t = transfer(tls_now); !t.ok()) return Fail("warm-up", t.status());
  }
  std::vector<double> plain_mbs, tls_mbs, ns_per_byte, ceiling_mbs, busy, tls_busy, extra_ns,
      vs_plain, vs_ceiling, cpu_vs_ceiling;
  for (int round = 0; round < options.rounds; ++round) {
    Transfer t[2];  // [0] plaintext, [1] TLS
    for (int k = 0; k < 2; ++k) {
      const int path = (k + round) % 2;
      absl::StatusOr<Transfer> done = transfer(path == 1);
      if (!done.ok()) return Fail(path == 1 ? "mutual TLS" : "plaintext", done.status());
      t[path] = *done;
    }
    absl::StatusOr<double> cipher_cpu = CipherSeconds(*cipher, bytes, total_bytes);
    if (!cipher_cpu.ok()) return Fail("cipher", cipher_cpu.status());
    const double ceiling = TlsCeiling(total_bytes, t[0], *cipher_cpu, cores);
    plain_mbs.push_back(total_bytes / 1e6 / t[0].seconds);
    tls_mbs.push_back(total_bytes / 1e6 / t[1].seconds);
    ns_per_byte.push_back(*cipher_cpu * 1e9 / total_bytes);
    ceiling_mbs.push_back(ceiling);
    busy.push_back(t[0].cpu / t[0].seconds);
    tls_busy.push_back(t[1].cpu / t[1].seconds);
    // What the TLS transfer spent beyond the plaintext one and the cipher: framing, copies.
    extra_ns.push_back((t[1].cpu - t[0].cpu - *cipher_cpu) * 1e9 / total_bytes);
    vs_plain.push_back(tls_mbs.back() / plain_mbs.back());
    vs_ceiling.push_back(tls_mbs.back() / ceiling);
    // The same comparison in CPU alone (the ratio if both transfers had the same cores busy):
    // what the ceiling spends, plaintext + cipher, over what the TLS transfer spent.
    cpu_vs_ceiling.push_back((t[0].cpu + *cipher_cpu) / t[1].cpu);
    std::printf("round %d: plaintext %.0f MB/s (cpu %.3f s, %.2f cores busy), mutual TLS %.0f "
                "MB/s (cpu %.3f s, %.2f cores busy); cipher %.3f ns/byte (%.3f s); ceiling %.0f "
                "MB/s: x%.3f\n",
                round + 1, plain_mbs.back(), t[0].cpu, busy.back(), tls_mbs.back(), t[1].cpu,
                tls_busy.back(),
                ns_per_byte.back(), *cipher_cpu, ceiling, vs_ceiling.back());
    std::fflush(stdout);
  }
  plain->get()->ClearStores();
  secure->get()->ClearStores();
  std::printf("plaintext MB/s          %s\n", Spread(plain_mbs, 0).c_str());
  std::printf("mutual TLS MB/s         %s\n", Spread(tls_mbs, 0).c_str());
  std::printf("cipher ns/byte moved    %s (%s seal + open, 16 KiB records, one thread's CPU)\n",
              Spread(ns_per_byte).c_str(), suite.c_str());
  std::printf("cores busy: plaintext %s; mutual TLS %s\n", Spread(busy, 2).c_str(),
              Spread(tls_busy, 2).c_str());
  std::printf("ceiling MB/s            %s\n", Spread(ceiling_mbs, 0).c_str());
  std::printf("TLS CPU beyond plaintext + cipher, ns/byte moved %s\n", Spread(extra_ns).c_str());
  std::printf("per-round TLS/plaintext %s\n", Spread(vs_plain).c_str());
  std::printf("per-round CPU (plaintext + cipher)/TLS %s\n", Spread(cpu_vs_ceiling).c_str());
  std::printf("per-round TLS/ceiling   %s\n", Spread(vs_ceiling).c_str());
  std::printf("ratio distribution_tls_vs_ceiling %.4f\n", Median(vs_ceiling));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  meshrun::ConfigureMutexDeadlockDetection();
  Options options;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--mib") == 0 && i + 1 < argc) {
      options.mib = std::atoll(argv[++i]);
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      options.rounds = std::atoi(argv[++i]);
    } else if (std::strcmp(argv[i], "--dir") == 0 && i + 1 < argc) {
      options.parent = argv[++i];
    } else if (std::strcmp(argv[i], "--tls_vs_ceiling") == 0 && i + 1 < argc) {
      options.tls_vs_ceiling = std::atoi(argv[++i]) != 0;
    } else {
      std::fprintf(stderr,
                   "usage: %s [--mib N] [--rounds R] [--dir DIR] [--tls_vs_ceiling 0|1]\n",
                   argv[0]);
      return 2;
    }
  }
  if (options.mib < 1 || options.rounds < 1) {
    std::fprintf(stderr, "distribution_bench: --mib and --rounds must be >= 1\n");
    return 2;
  }
  spdlog::set_level(spdlog::level::err);  // the workers retry registering with no coordinator

  std::string templ = options.parent + "/meshrun_distribution_bench.XXXXXX";
  if (mkdtemp(templ.data()) == nullptr) {
    std::fprintf(stderr, "distribution_bench: cannot create a directory under %s\n",
                 options.parent.c_str());
    return 1;
  }
  const std::string dir = templ;
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{dir};
  if (!options.tls_vs_ceiling) {
    if (absl::Status tls = bench::MaybeEnableTls(dir, "coordinator"); !tls.ok()) {
      std::fprintf(stderr, "distribution_bench: %s\n", std::string(tls.message()).c_str());
      return 1;
    }
  }

  // The artifact: pseudo-random bytes (incompressible), stored in the coordinator's cache.
  std::string bytes(static_cast<size_t>(options.mib) << 20, '\0');
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
  // Every meshrun transfer sends a new executable under the same cache key (replacing the
  // previous entry, whose handle stays readable): a worker refuses to receive one it holds,
  // and its store remembers what it held after the bench deleted the file.
  uint64_t generation = 0;
  const auto next = [&]() -> absl::StatusOr<coordinator::CachedExecutable> {
    ++generation;
    std::memcpy(bytes.data(), &generation, sizeof(generation));
    RETURN_IF_ERROR((*cache)->Insert(key, bytes));
    ASSIGN_OR_RETURN(std::optional<coordinator::CachedExecutable> entry, (*cache)->Lookup(key));
    if (!entry.has_value()) return absl::InternalError("cache entry gone after Insert");
    return *std::move(entry);
  };
  if (options.tls_vs_ceiling) return RunTlsVsCeiling(options, dir, bytes, next);

  auto receivers = StartReceivers(dir);
  if (!receivers.ok()) return Fail("start workers", receivers.status());
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
    bare_stubs.push_back(
        v1::Worker::NewStub(services::MakeChannel(absl::StrCat("127.0.0.1:", port))));
  }
  auto run_meshrun = [&]() -> absl::StatusOr<Transfer> {
    ASSIGN_OR_RETURN(coordinator::CachedExecutable executable, next());
    return SendToWorkers(**receivers, executable);
  };
  auto run_grpc = [&]() -> absl::StatusOr<Transfer> {
    const double cpu_start = ProcessCpuSeconds(), start = Now();
    RETURN_IF_ERROR(ToBoth([&](size_t i) { return SendPlain(*bare_stubs[i], bytes); }));
    return Transfer{.seconds = Now() - start, .cpu = ProcessCpuSeconds() - cpu_start};
  };

  const double total_mb = 2.0 * static_cast<double>(bytes.size()) / 1e6;
  std::printf("artifact %lld MiB, 2 workers on loopback, 1 MiB chunks, %d rounds; state under "
              "%s\n",
              static_cast<long long>(options.mib), options.rounds, dir.c_str());
  // Warm-up: one transfer each (connections, allocator, page cache).
  if (auto s = run_meshrun(); !s.ok()) return Fail("meshrun warm-up", s.status());
  if (auto s = run_grpc(); !s.ok()) return Fail("grpc warm-up", s.status());
  std::vector<double> meshrun_mbs, grpc_mbs, paired, meshrun_cpu, grpc_cpu;
  for (int round = 0; round < options.rounds; ++round) {
    double m = 0, g = 0;
    for (int k = 0; k < 2; ++k) {
      const bool meshrun_now = (k + round) % 2 == 0;
      absl::StatusOr<Transfer> t = meshrun_now ? run_meshrun() : run_grpc();
      if (!t.ok()) return Fail(meshrun_now ? "meshrun" : "grpc", t.status());
      (meshrun_now ? m : g) = total_mb / t->seconds;
      (meshrun_now ? meshrun_cpu : grpc_cpu).push_back(t->cpu);
    }
    meshrun_mbs.push_back(m);
    grpc_mbs.push_back(g);
    paired.push_back(m / g);
    std::printf("round %d: meshrun %.0f MB/s, grpc %.0f MB/s\n", round + 1, m, g);
    std::fflush(stdout);
  }
  (*receivers)->ClearStores();
  const double m = Median(meshrun_mbs), g = Median(grpc_mbs);
  std::printf("meshrun (cache -> LoadExecutable -> CRC-32C + store): median %.0f MB/s "
              "(%.2f s for both workers)\n", m, total_mb / m);
  std::printf("plain gRPC client stream to a discarding server:    median %.0f MB/s "
              "(%.2f s for both workers)\n", g, total_mb / g);
  std::printf("meshrun MB/s %s\n", Spread(meshrun_mbs, 0).c_str());
  std::printf("grpc MB/s    %s\n", Spread(grpc_mbs, 0).c_str());
  std::printf("per-round meshrun/grpc %s; ratio of medians %.4f\n", Spread(paired).c_str(),
              m / g);
  std::vector<double> cpu_ratios;  // less sensitive than wall time to a loaded machine
  for (size_t i = 0; i < meshrun_cpu.size(); ++i) {
    cpu_ratios.push_back(grpc_cpu[i] / meshrun_cpu[i]);
  }
  std::printf("process CPU per distribution (client + servers): meshrun median %.2f s, grpc "
              "median %.2f s; per-round grpc/meshrun CPU %s\n", Median(meshrun_cpu),
              Median(grpc_cpu), Spread(cpu_ratios).c_str());

  // Where the time goes: the worker-side steps alone, single thread, over the same bytes.
  {
    auto executable = next();
    if (!executable.ok()) return Fail("cache insert", executable.status());
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
    if (absl::Status s = executable->ForEachChunk(kChunk, [&](absl::string_view piece) {
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
                static_cast<long long>(options.mib), sha_mbs,
                digest == executable->sha256() ? "" : " (DIGEST MISMATCH)",
                bytes.size() / 1e6 / (written - write_start), synced - written,
                bytes.size() / 1e6 / (synced - write_start), read_mbs);
  }
  receivers->reset();
  for (auto& server : bare) server->Shutdown();
  std::printf("ratio distribution_vs_grpc %.4f\n", Median(paired));
  return 0;
}
