#include "testing/fake_fleet.h"

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_status.h"
#include "common/protocol.h"
#include "common/sha256.h"
#include "meshrun/v1/worker.grpc.pb.h"
#include "rpc/channel_health.h"
#include "worker_service/telemetry_relay.h"

namespace meshrun::test_support {

struct FakeFleet::Host {
  int index = 0;
  std::string name;
  std::string incarnation;
  int port = 0;
  std::vector<v1::DeviceInfo> devices;
  absl::Mutex mu;
  std::set<std::string> executables ABSL_GUARDED_BY(mu);  // fingerprints received
  std::map<std::string, v1::JobManifest> started ABSL_GUARDED_BY(mu);  // by job id
  std::string job_id ABSL_GUARDED_BY(mu);  // the job it runs, "" after StopJob
  int64_t last_step ABSL_GUARDED_BY(mu) = 0;
  // The relay StartJob named for this host (docs/scale.md, "Telemetry relays"); empty: none.
  std::string relay_address ABSL_GUARDED_BY(mu);
  std::unique_ptr<UploadStream> upload;  // opened by the first UploadStep
  // This host's relay for its group, made by the first RelayTelemetry call to it.
  std::unique_ptr<services::TelemetryRelay> relay ABSL_GUARDED_BY(mu);
  std::unique_ptr<HeartbeatStream> beats;  // opened by the first beat (HeartbeatLoop's)
};

namespace {
v1::RuntimeIdentity TpuRuntime() {
  v1::RuntimeIdentity runtime;
  runtime.set_platform_name("tpu");
  runtime.set_platform_version("TFRT TPU v6 lite");
  runtime.set_pjrt_api_major(0);
  runtime.set_pjrt_api_minor(81);
  runtime.set_plugin_sha256(std::string(64, 'a'));  // no coordinator holds this libtpu
  return runtime;
}

// Seeded bytes standing in for a compiled program: the same program gives the same bytes.
std::string FakeExecutable(const std::string& stablehlo, int64_t bytes) {
  std::string out(static_cast<size_t>(bytes), '\0');
  uint64_t x = std::hash<std::string>()(stablehlo) | 1;
  for (char& c : out) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    c = static_cast<char>(x);
  }
  return out;
}
}  // namespace

// One host's summary stream, UploadTelemetry to the coordinator or RelayTelemetry to its
// relay: summaries queue without blocking and go out one write at a time; acks are read and
// dropped.
class FakeFleet::UploadStream final
    : public grpc::ClientBidiReactor<v1::HostSummary, v1::UploadTelemetryAck> {
 public:
  UploadStream(FakeFleet* fleet, v1::Coordinator::Stub& stub) : fleet_(fleet) {
    stub.async()->UploadTelemetry(&context_, this);
    StartRead(&ack_);
    StartCall();
  }
  UploadStream(FakeFleet* fleet, v1::Worker::Stub& relay) : fleet_(fleet) {
    relay.async()->RelayTelemetry(&context_, this);
    StartRead(&ack_);
    StartCall();
  }
  void Send(v1::HostSummary summary) {
    {
      absl::MutexLock lock(&mu_);
      if (done_) return;
      queue_.push_back(std::move(summary));
      if (writing_) return;
      writing_ = true;
      current_ = std::move(queue_.front());
      queue_.pop_front();
    }
    StartWrite(&current_);
  }
  // Cancels the stream and waits (bounded) for its end.
  void Close() {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(10));
  }

 private:
  void OnWriteDone(bool ok) override {
    {
      absl::MutexLock lock(&mu_);
      if (!ok || queue_.empty()) {
        writing_ = false;
        return;
      }
      current_ = std::move(queue_.front());
      queue_.pop_front();
    }
    StartWrite(&current_);
  }
  void OnReadDone(bool ok) override {
    if (ok) StartRead(&ack_);
  }
  void OnDone(const grpc::Status& status) override {
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
      absl::MutexLock lock(&fleet_->mu_);
      ++fleet_->figures_.summaries_refused;
      fleet_->figures_.last_error = status.error_message();
    }
    absl::MutexLock lock(&mu_);
    done_ = true;
  }

  FakeFleet* const fleet_;
  grpc::ClientContext context_;
  v1::UploadTelemetryAck ack_;
  absl::Mutex mu_;
  std::deque<v1::HostSummary> queue_ ABSL_GUARDED_BY(mu_);
  v1::HostSummary current_;  // written by the one write in flight
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// One host's StreamHeartbeats call: one beat written at a time (a beat falling due while the
// last is still being written is skipped, as a worker's would wait behind it). A timed beat
// asks for an ack, and each ack times the oldest timed beat not yet acknowledged; an untimed
// one, as a worker's, counts once written. A read stays in flight until the call ends, so while
// `read_ended_` is false gRPC has not run OnDone and a write may still be started.
class FakeFleet::HeartbeatStream final
    : public grpc::ClientBidiReactor<v1::HeartbeatRequest, v1::HeartbeatResponse> {
 public:
  HeartbeatStream(FakeFleet* fleet, v1::Coordinator::Stub& stub) : fleet_(fleet) {
    stub.async()->StreamHeartbeats(&context_, this);
    StartRead(&ack_);
    StartCall();
  }
  void Send(v1::HeartbeatRequest beat, bool timed) {
    absl::MutexLock lock(&mu_);
    if (read_ended_ || writing_) return;
    writing_ = true;
    current_ = std::move(beat);
    current_.set_ack(timed);
    if (timed) sent_.push_back(absl::Now());
    StartWrite(&current_);  // its OnWriteDone runs on a gRPC thread, never inline
  }
  // Cancels the stream and waits (bounded) for its end.
  void Close() {
    context_.TryCancel();
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&done_), absl::Seconds(10));
  }

 private:
  void OnWriteDone(bool ok) override {
    bool written_untimed;
    {
      absl::MutexLock lock(&mu_);
      writing_ = false;
      written_untimed = ok && !current_.ack();
    }
    if (written_untimed) fleet_->RecordHeartbeat(absl::ZeroDuration(), grpc::Status::OK);
  }
  void OnReadDone(bool ok) override {
    absl::Time sent;
    {
      absl::MutexLock lock(&mu_);
      if (!ok) {
        read_ended_ = true;
        return;
      }
      sent = sent_.front();
      sent_.pop_front();
    }
    fleet_->RecordHeartbeat(absl::Now() - sent, grpc::Status::OK);
    StartRead(&ack_);
  }
  void OnDone(const grpc::Status& status) override {
    if (!status.ok() && status.error_code() != grpc::StatusCode::CANCELLED) {
      fleet_->RecordHeartbeat(absl::ZeroDuration(), status);
    }
    absl::MutexLock lock(&mu_);
    done_ = true;
  }

  FakeFleet* const fleet_;
  grpc::ClientContext context_;
  v1::HeartbeatResponse ack_;
  v1::HeartbeatRequest current_;  // written by the one write in flight
  absl::Mutex mu_;
  std::deque<absl::Time> sent_ ABSL_GUARDED_BY(mu_);  // timed beats not yet acknowledged
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

// The Worker calls a launch makes, for every fake host; the :authority a call was made to
// ("127.0.0.1:<port>") names the host.
class FakeFleet::WorkerService final
    : public v1::Worker::WithCallbackMethod_RelayTelemetry<v1::Worker::Service> {
 public:
  explicit WorkerService(FakeFleet* fleet) : fleet_(fleet) {}
  void IndexPorts() {
    for (const auto& host : fleet_->hosts_) by_port_[host->port] = host.get();
  }

  grpc::Status GetSupportedVersions(grpc::ServerContext*,
                                    const v1::GetWorkerSupportedVersionsRequest*,
                                    v1::SupportedVersions* response) override {
    response->set_min_version(kProtocolMinVersion);
    response->set_max_version(kProtocolMaxVersion);
    return grpc::Status::OK;
  }
  grpc::Status GetStatus(grpc::ServerContext* context, const v1::GetStatusRequest*,
                         v1::WorkerStatusReport* response) override {
    Host* host = HostOf(*context);
    if (host == nullptr) return Unknown(*context);
    response->set_host(host->name);
    response->set_incarnation(host->incarnation);
    *response->mutable_runtime() = TpuRuntime();
    for (const v1::DeviceInfo& d : host->devices) *response->add_devices() = d;
    absl::MutexLock lock(&host->mu);
    for (const std::string& fp : host->executables) response->add_executable_fingerprints(fp);
    response->set_running_job_id(host->job_id);
    response->set_current_step(host->last_step);
    return grpc::Status::OK;
  }
  grpc::Status CompileProgram(grpc::ServerContext* context,
                              const v1::CompileProgramRequest* request,
                              grpc::ServerWriter<v1::LoadExecutableChunk>* writer) override {
    if (HostOf(*context) == nullptr) return Unknown(*context);
    const std::string bytes =
        FakeExecutable(request->program().stablehlo(), fleet_->config_.executable_bytes);
    constexpr size_t kChunk = 1 << 20;
    for (size_t offset = 0; offset < bytes.size(); offset += kChunk) {
      v1::LoadExecutableChunk chunk;
      chunk.set_offset(static_cast<int64_t>(offset));
      chunk.set_data(bytes.substr(offset, kChunk));
      if (offset == 0) chunk.set_total_bytes(static_cast<int64_t>(bytes.size()));
      if (offset + kChunk >= bytes.size()) chunk.set_sha256(Sha256Hex(bytes));
      if (!writer->Write(chunk)) return grpc::Status(grpc::StatusCode::CANCELLED, "closed");
    }
    return grpc::Status::OK;
  }
  grpc::Status LoadExecutable(grpc::ServerContext* context,
                              grpc::ServerReader<v1::LoadExecutableChunk>* reader,
                              v1::LoadExecutableResponse* response) override {
    Host* host = HostOf(*context);
    if (host == nullptr) return Unknown(*context);
    v1::LoadExecutableChunk chunk;
    int64_t bytes = 0;
    while (reader->Read(&chunk)) {
      if (!chunk.fingerprint().empty()) response->set_fingerprint(chunk.fingerprint());
      bytes += static_cast<int64_t>(chunk.data().size());
    }
    response->set_bytes_received(bytes);
    absl::MutexLock lock(&host->mu);
    host->executables.insert(response->fingerprint());
    return grpc::Status::OK;
  }
  grpc::Status StartJob(grpc::ServerContext* context, const v1::StartJobRequest* request,
                        v1::StartJobResponse*) override {
    Host* host = HostOf(*context);
    if (host == nullptr) return Unknown(*context);
    const int64_t bytes = static_cast<int64_t>(request->ByteSizeLong());
    {
      absl::MutexLock lock(&host->mu);
      host->started[request->job_id()] = request->manifest();
      host->job_id = request->job_id();
      host->last_step = 0;
      host->relay_address = request->telemetry_relay_address();
    }
    absl::MutexLock lock(&fleet_->mu_);
    ++fleet_->figures_.start_job_calls;
    fleet_->figures_.start_job_bytes += bytes;
    fleet_->figures_.start_job_max_bytes = std::max(fleet_->figures_.start_job_max_bytes, bytes);
    return grpc::Status::OK;
  }
  // The product's relay (worker_service/telemetry_relay.h), one per relaying host.
  grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck>* RelayTelemetry(
      grpc::CallbackServerContext* context) override {
    Host* host = HostOf(*context);
    if (host == nullptr) {
      auto* refused = new RefusedStream;
      refused->Finish(Unknown(*context));
      return refused;
    }
    services::TelemetryRelay* relay;
    {
      absl::MutexLock lock(&host->mu);
      if (host->relay == nullptr) {
        host->relay = std::make_unique<services::TelemetryRelay>(services::TelemetryRelay::Config{
            .coordinator = fleet_->channels_[fleet_->ChannelOf(host->index)]});
      }
      relay = host->relay.get();
    }
    return relay->Serve(context);
  }
  grpc::Status StopJob(grpc::ServerContext* context, const v1::StopJobRequest* request,
                       v1::StopJobResponse*) override {
    Host* host = HostOf(*context);
    if (host == nullptr) return Unknown(*context);
    absl::MutexLock lock(&host->mu);
    if (host->job_id == request->job_id()) host->job_id.clear();
    return grpc::Status::OK;
  }

 private:
  Host* HostOf(const grpc::ServerContextBase& context) const {
    const grpc::string_ref authority = context.ExperimentalGetAuthority();
    const std::string text(authority.data(), authority.size());
    int port = 0;
    if (size_t colon = text.rfind(':');
        colon == std::string::npos || !absl::SimpleAtoi(text.substr(colon + 1), &port)) {
      return nullptr;
    }
    auto it = by_port_.find(port);
    return it == by_port_.end() ? nullptr : it->second;
  }
  static grpc::Status Unknown(const grpc::ServerContextBase& context) {
    const grpc::string_ref authority = context.ExperimentalGetAuthority();
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        absl::StrCat("no fake host serves ",
                                     std::string(authority.data(), authority.size())));
  }

  struct RefusedStream final
      : public grpc::ServerBidiReactor<v1::HostSummary, v1::UploadTelemetryAck> {
    void OnDone() override { delete this; }
  };

  FakeFleet* const fleet_;
  std::map<int, Host*> by_port_;  // filled before the server takes calls, read-only after
};

FakeFleet::FakeFleet(Config config) : config_(std::move(config)) {
  for (int c = 0; c < std::max(1, config_.channels); ++c) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per channel
    channels_.push_back(
        grpc::CreateCustomChannel(config_.coordinator, grpc::InsecureChannelCredentials(), args));
    stubs_.push_back(v1::Coordinator::NewStub(channels_.back()));
  }
  for (int i = 0; i < config_.hosts; ++i) {
    auto host = std::make_unique<Host>();
    host->index = i;
    host->name = absl::StrCat("fake-tpu-", i);
    host->incarnation = absl::StrCat("fleet-", getpid(), "-", i);
    for (int d = 0; d < config_.devices_per_host; ++d) {
      v1::DeviceInfo& device = host->devices.emplace_back();
      device.set_global_id(i * config_.devices_per_host + d);
      device.set_local_id(d);
      device.set_process_index(i);
      device.set_kind("TPU v6 lite");
      device.set_runtime_name(absl::StrCat("TPU:", d));
      device.add_coords(d % 2);
      device.add_coords((i * config_.devices_per_host + d) / 2);
      device.add_coords(0);
    }
    hosts_.push_back(std::move(host));
  }
}

FakeFleet::~FakeFleet() {
  stop_ = true;
  if (heartbeats_.joinable()) heartbeats_.join();
  for (auto& host : hosts_) {
    if (host->upload != nullptr) host->upload->Close();
    if (host->beats != nullptr) host->beats->Close();
  }
  for (int i = 0; i < static_cast<int>(hosts_.size()) && server_ != nullptr; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::DeregisterWorkerRequest request;
    request.set_host(hosts_[i]->name);
    request.set_incarnation(hosts_[i]->incarnation);
    v1::DeregisterWorkerResponse response;
    StubFor(i).DeregisterWorker(&context, request, &response);  // the coordinator may be gone
  }
  for (int i = 0; i < 500 && beats_in_flight_ > 0; ++i) absl::SleepFor(absl::Milliseconds(10));
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

size_t FakeFleet::ChannelOf(int host) const { return host % channels_.size(); }
v1::Coordinator::Stub& FakeFleet::StubFor(int host) { return *stubs_[ChannelOf(host)]; }

absl::Status FakeFleet::Start() {
  service_ = std::make_unique<WorkerService>(this);
  grpc::ServerBuilder builder;
  for (auto& host : hosts_) {
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &host->port);
  }
  builder.RegisterService(service_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr) return absl::UnavailableError("the fake hosts' server did not start");
  service_->IndexPorts();
  for (int i = 0; i < static_cast<int>(hosts_.size()); ++i) {
    const Host& host = *hosts_[i];
    if (host.port == 0) {
      return absl::UnavailableError(absl::StrCat("no port for ", host.name));
    }
    v1::RegisterWorkerRequest request;
    v1::WorkerRegistration& r = *request.mutable_registration();
    r.mutable_protocol()->set_version(kProtocolVersion);
    r.set_host(host.name);
    r.set_address(absl::StrCat("127.0.0.1:", host.port));
    r.set_num_slices(1);
    r.set_worker_index(i);
    *r.mutable_runtime() = TpuRuntime();
    for (const v1::DeviceInfo& d : host.devices) *r.add_devices() = d;
    r.set_incarnation(host.incarnation);
    r.set_host_memory_bytes(int64_t{512} << 30);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::RegisterWorkerResponse response;
    const absl::Status registered =
        FromGrpcStatus(StubFor(i).RegisterWorker(&context, request, &response));
    if (!registered.ok()) {
      return absl::Status(registered.code(),
                          absl::StrCat("registering ", host.name, ": ", registered.message()));
    }
    if (response.heartbeat_interval_millis() > 0) {
      heartbeat_interval_ = absl::Milliseconds(response.heartbeat_interval_millis());
    }
  }
  heartbeats_ = std::thread([this] { HeartbeatLoop(); });
  return absl::OkStatus();
}

// Each host beats once per interval, on its heartbeat stream or by a Heartbeat call each, the
// hosts' phases spread evenly over it as independent hosts' registrations would spread them,
// each beat sent on the heartbeat tick a worker would send it on (HeartbeatTick); each beat's
// round trip is recorded.
void FakeFleet::HeartbeatLoop() {
  struct Beat {
    grpc::ClientContext context;
    v1::HeartbeatRequest request;
    v1::HeartbeatResponse response;
    absl::Time sent;
  };
  const int n = static_cast<int>(hosts_.size());
  absl::Time next = absl::Now();
  while (!stop_) {
    for (int i = 0; i < n && !stop_; ++i) {
      next += heartbeat_interval_ / n;
      const absl::Time due = services::HeartbeatTick(next, heartbeat_interval_);
      for (absl::Duration wait = due - absl::Now(); wait > absl::ZeroDuration() && !stop_;
           wait = due - absl::Now()) {
        absl::SleepFor(std::min(wait, absl::Milliseconds(100)));  // stop_ seen within 100 ms
      }
      if (stop_) break;
      Host& host = *hosts_[i];
      v1::HeartbeatRequest request;
      request.set_host(host.name);
      request.set_incarnation(host.incarnation);
      {
        absl::MutexLock lock(&host.mu);
        if (!host.job_id.empty()) {
          request.set_job_id(host.job_id);
          request.set_last_completed_step(host.last_step);
        }
      }
      if (!config_.unary_heartbeats) {
        if (host.beats == nullptr) host.beats = std::make_unique<HeartbeatStream>(this, StubFor(i));
        host.beats->Send(std::move(request), time_heartbeats_);
        continue;
      }
      auto* beat = new Beat;
      beat->request = std::move(request);
      beat->context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      beat->sent = absl::Now();
      ++beats_in_flight_;
      StubFor(i).async()->Heartbeat(&beat->context, &beat->request, &beat->response,
                                    [this, beat](grpc::Status status) {
                                      RecordHeartbeat(absl::Now() - beat->sent, status);
                                      delete beat;
                                      --beats_in_flight_;
                                    });
    }
  }
}

void FakeFleet::RecordHeartbeat(absl::Duration took, const grpc::Status& error) {
  absl::MutexLock lock(&mu_);
  if (error.ok()) {
    ++figures_.heartbeats;
  } else {
    ++figures_.heartbeat_errors;
    figures_.last_error = error.error_message();
  }
  figures_.worst_heartbeat = std::max(figures_.worst_heartbeat, took);
}

bool FakeFleet::AwaitStarted(const std::string& job_id, absl::Duration timeout) const {
  const absl::Time deadline = absl::Now() + timeout;
  for (const auto& host : hosts_) {
    absl::MutexLock lock(&host->mu);
    auto started = [&]() ABSL_SHARED_LOCKS_REQUIRED(host->mu) {
      return host->started.contains(job_id);
    };
    if (!host->mu.AwaitWithDeadline(absl::Condition(&started), deadline)) return false;
  }
  return true;
}

void FakeFleet::UploadStep(const std::string& job_id, int64_t step) {
  for (int i = 0; i < static_cast<int>(hosts_.size()); ++i) {
    Host& host = *hosts_[i];
    v1::HostSummary summary;
    {
      absl::MutexLock lock(&host.mu);
      auto started = host.started.find(job_id);
      if (started == host.started.end()) continue;
      const v1::JobManifest& job = started->second;
      host.last_step = step;
      summary.set_attempt(job.attempts_size());
      for (const v1::TelemetryDeclaration& declared : job.spec().telemetry()) {
        v1::TelemetryValue* value = summary.add_values();
        value->set_name(declared.name());
        int64_t elements = 1;
        for (int64_t dim : declared.shape()) {
          value->add_shape(dim);
          elements *= dim;
        }
        for (int64_t e = 0; e < elements; ++e) value->add_values(1.0f / static_cast<float>(step));
      }
    }
    summary.set_job_id(job_id);
    summary.set_step(step);
    summary.set_host(host.name);
    summary.set_incarnation(host.incarnation);
    summary.set_replica_count(config_.devices_per_host);  // data-parallel over every chip
    summary.set_step_time_seconds(0.01);
    summary.set_wall_time_unix_micros(absl::GetCurrentTimeNanos() / 1000);
    if (host.upload == nullptr) {
      std::string relay;
      {
        absl::MutexLock lock(&host.mu);
        relay = host.relay_address;
      }
      if (relay.empty()) {
        host.upload = std::make_unique<UploadStream>(this, StubFor(i));
      } else {
        std::unique_ptr<v1::Worker::Stub>& stub = relay_stubs_[relay];
        if (stub == nullptr) stub = v1::Worker::NewStub(grpc::CreateChannel(
                                 relay, grpc::InsecureChannelCredentials()));
        host.upload = std::make_unique<UploadStream>(this, *stub);
      }
    }
    host.upload->Send(std::move(summary));
  }
}

FakeFleet::Figures FakeFleet::GetFigures() const {
  absl::MutexLock lock(&mu_);
  return figures_;
}

void FakeFleet::ResetHeartbeatFigures() {
  absl::MutexLock lock(&mu_);
  figures_.worst_heartbeat = absl::ZeroDuration();
  figures_.heartbeats = 0;
  figures_.heartbeat_errors = 0;
}

}  // namespace meshrun::test_support
