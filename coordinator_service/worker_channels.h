// The coordinator's channels to its workers: one per worker host and address, shared by every
// call to that worker (launches, checkpoints, probes, metrics scrapes, drains), so a call reuses
// the connection (and its TLS session) instead of opening one per call. Channels of workers the
// registry no longer counts alive at that address are dropped by KeepOnly, so a fleet that
// churns does not keep a channel per host it ever saw.
//
// Lifetime: a Worker handle keeps its channel alive after KeepOnly dropped it from the cache, so
// a call under way finishes on it. Thread-safety: all methods are safe to call concurrently.
#pragma once

#include <map>
#include <memory>
#include <set>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "meshrun/v1/worker.grpc.pb.h"

namespace meshrun::services {

class WorkerChannels {
 public:
  struct Peer {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<v1::Worker::Stub> stub;
  };
  // One worker's channel and stub, held for as long as the handle lives.
  class Worker {
   public:
    explicit Worker(std::shared_ptr<const Peer> peer) : peer_(std::move(peer)) {}
    v1::Worker::Stub* operator->() const { return peer_->stub.get(); }
    v1::Worker::Stub& operator*() const { return *peer_->stub; }
    const std::shared_ptr<grpc::Channel>& channel() const { return peer_->channel; }

   private:
    std::shared_ptr<const Peer> peer_;
  };

  // The channel to `host` at `address`, created on first use. security: the worker called must
  // present `host`'s identity (never one looked up by address: an address may change hands).
  // When the channel is failing (the worker restarted at this address, gRPC is backing off),
  // waits up to `reconnect_wait` for it to connect again.
  Worker At(const std::string& host, const std::string& address,
            absl::Duration reconnect_wait = absl::ZeroDuration());

  // Drops every channel whose host@address is not in `keep` (Key). Returns how many it dropped.
  int KeepOnly(const std::set<std::string>& keep);
  static std::string Key(const std::string& host, const std::string& address);

  size_t size() const;

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<const Peer>> peers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun::services
