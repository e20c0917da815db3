// Many WatchTelemetryBatches readers of one job, on a few channels, with gRPC's callback API (no
// thread per watcher): the telemetry load test and the fan-out benchmark read their servers with
// this same client code, and publish the same summaries (FillValues).
//
// Each reader checks that steps arrive consecutively (a gap, duplicate or reordering counts as
// a break) and records the delivery latency of every summary: receive time minus the summary's
// wall_time_unix_micros (the publisher stamps it when it sends), in microseconds.
//
// Lifetime: Start() opens the streams; the destructor cancels those still open and waits for
// them. Thread-safety: call from one thread; per-reader results are read after AwaitDone().
// Header-only.
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "meshrun/v1/coordinator.grpc.pb.h"

namespace meshrun::test_support {

// Fills a HostSummary or GlobalSummary with one step of a job: loss, grad_norm and a 6x4 sink mass, as the transformer example reports.
template <typename Summary>
void FillValues(Summary& s, int64_t step) {
  s.set_step(step);
  s.set_step_time_seconds(0.01);
  s.set_wall_time_unix_micros(absl::GetCurrentTimeNanos() / 1000);
  for (const char* name : {"loss", "grad_norm"}) {
    v1::TelemetryValue* v = s.add_values();
    v->set_name(name);
    v->add_values(1.0f / step);
  }
  v1::TelemetryValue* sink = s.add_values();
  sink->set_name("sink_mass");
  sink->add_shape(6);
  sink->add_shape(4);
  for (int i = 0; i < 24; ++i) sink->add_values(0.01f * i);
}

class WatchFleet {
 public:
  struct Config {
    std::string address;  // host:port of a server of the Coordinator service
    int watchers = 500;
    int channels = 4;     // connections the watchers are spread over
    v1::WatchTelemetryRequest request;
    size_t expected_summaries = 0;  // per watcher, to reserve the latency buffers up front
    std::shared_ptr<grpc::ChannelCredentials> credentials;  // null: plaintext
  };

  class Reader final : public grpc::ClientReadReactor<v1::GlobalSummaryBatch> {
   public:
    std::atomic<int64_t> received{0};
    int64_t messages = 0;  // stream messages read (a batch holds one summary or more)
    std::atomic<bool> ended{false};
    int64_t last_step = 0;
    int64_t breaks = 0;  // summaries that did not follow the previous step
    std::vector<uint32_t> latency_micros;
    grpc::Status status;  // how the stream ended (after AwaitDone)

   private:
    friend class WatchFleet;
    Reader(WatchFleet* fleet, v1::Coordinator::Stub* stub, const v1::WatchTelemetryRequest& request,
           size_t reserve)
        : fleet_(fleet) {
      latency_micros.reserve(reserve);
      stub->async()->WatchTelemetryBatches(&context_, &request, this);
      StartRead(&in_);
      StartCall();
    }
    void OnReadDone(bool ok) override {
      if (!ok) return;  // OnDone follows
      const int64_t now = absl::GetCurrentTimeNanos() / 1000;
      for (const v1::GlobalSummary& summary : in_.summaries()) {
        latency_micros.push_back(
            static_cast<uint32_t>(std::max<int64_t>(0, now - summary.wall_time_unix_micros())));
        if (last_step != 0 && summary.step() != last_step + 1) ++breaks;
        last_step = summary.step();
      }
      ++messages;
      received.fetch_add(in_.summaries_size(), std::memory_order_release);
      StartRead(&in_);
    }
    void OnDone(const grpc::Status& s) override {
      absl::MutexLock lock(&fleet_->mu_);
      status = s;
      ended.store(true, std::memory_order_release);
      ++fleet_->done_;
    }

    WatchFleet* const fleet_;
    grpc::ClientContext context_;
    v1::GlobalSummaryBatch in_;
  };

  explicit WatchFleet(Config config) : config_(std::move(config)) {}
  ~WatchFleet() {
    // Harmless on streams that already ended; not under mu_, which OnDone takes.
    for (auto& reader : readers_) reader->context_.TryCancel();
    AwaitDone(absl::Minutes(1));
  }

  void Start() {
    for (int c = 0; c < config_.channels; ++c) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // one connection per channel
      args.SetInt("meshrun.fleet_channel", c);
      stubs_.push_back(v1::Coordinator::NewStub(
          grpc::CreateCustomChannel(config_.address,
                                    config_.credentials != nullptr
                                        ? config_.credentials
                                        : grpc::InsecureChannelCredentials(),
                                    args)));
    }
    for (int i = 0; i < config_.watchers; ++i) {
      readers_.emplace_back(new Reader(this, stubs_[i % stubs_.size()].get(), config_.request,
                                       config_.expected_summaries));
    }
  }

  // True once every watcher has received at least `summaries` (or ended), within `timeout`.
  bool AwaitReceived(int64_t summaries, absl::Duration timeout) const {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      if (MinReceived() >= summaries) return true;
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(5));
    }
  }

  // True once every stream has ended, within `timeout`.
  bool AwaitDone(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return done_ == static_cast<int>(readers_.size());
    };
    return mu_.AwaitWithTimeout(absl::Condition(&all), timeout);
  }

  // The fewest summaries any watcher still streaming has received (INT64_MAX when none is).
  int64_t MinReceived() const {
    int64_t least = INT64_MAX;
    for (const auto& reader : readers_) {
      if (reader->ended.load(std::memory_order_acquire)) continue;
      least = std::min(least, reader->received.load(std::memory_order_acquire));
    }
    return least;
  }
  int64_t TotalReceived() const {
    int64_t total = 0;
    for (const auto& reader : readers_) total += reader->received.load(std::memory_order_acquire);
    return total;
  }

  const std::vector<std::unique_ptr<Reader>>& readers() const { return readers_; }

  // The p-th percentile (0..100) of every recorded latency, in microseconds.
  double LatencyPercentile(double p) const {
    std::vector<uint32_t> all;
    for (const auto& reader : readers_) {
      all.insert(all.end(), reader->latency_micros.begin(), reader->latency_micros.end());
    }
    if (all.empty()) return 0;
    const size_t k = std::min(all.size() - 1, static_cast<size_t>(p / 100.0 * all.size()));
    std::nth_element(all.begin(), all.begin() + k, all.end());
    return all[k];
  }

 private:
  const Config config_;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs_;
  std::vector<std::unique_ptr<Reader>> readers_;
  mutable absl::Mutex mu_;
  int done_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace meshrun::test_support
