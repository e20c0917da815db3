#include "coordinator_service/worker_channels.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "rpc/channel_health.h"
#include "rpc/server_support.h"

namespace meshrun::services {

std::string WorkerChannels::Key(const std::string& host, const std::string& address) {
  return absl::StrCat(host, "@", address);
}

WorkerChannels::Worker WorkerChannels::At(const std::string& host, const std::string& address,
                                          absl::Duration reconnect_wait) {
  std::shared_ptr<const Peer> peer;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<const Peer>& slot = peers_[Key(host, address)];
    if (slot == nullptr) {
      auto fresh = std::make_shared<Peer>();
      fresh->channel = MakeWorkerChannel(address, host);
      fresh->stub = v1::Worker::NewStub(fresh->channel);
      slot = std::move(fresh);
    }
    peer = slot;
  }
  ReconnectIfFailing(*peer->channel, reconnect_wait);
  return Worker(std::move(peer));
}

int WorkerChannels::KeepOnly(const std::set<std::string>& keep) {
  std::vector<std::shared_ptr<const Peer>> dropped;  // released outside the lock
  absl::MutexLock lock(&mu_);
  for (auto it = peers_.begin(); it != peers_.end();) {
    if (keep.contains(it->first)) {
      ++it;
    } else {
      dropped.push_back(std::move(it->second));
      it = peers_.erase(it);
    }
  }
  return static_cast<int>(dropped.size());
}

size_t WorkerChannels::size() const {
  absl::MutexLock lock(&mu_);
  return peers_.size();
}

}  // namespace meshrun::services
