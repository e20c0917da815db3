// gloo's rendezvous Store over our runtime::KeyValueClient, so gloo's peers exchange their
// addresses through the same key-value store the PJRT client uses (on a worker: the
// coordinator's, through its KeyValue RPCs). Every key is written under `prefix` + "/", so
// rendezvous of different jobs (or attempts) never see each other's keys.
//
// gloo's Store contract reports failures by exception: set / get / wait throw
// gloo::IoException with a message naming the keys and the store's error; a wait that times
// out names every key still missing.
//
// Thread-safety: safe to call from any thread. Lifetime: keeps a shared_ptr to its client.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gloo/rendezvous/store.h"
#include "runtime/kv_client.h"

namespace meshrun::worker::collectives {

class KeyValueGlooStore final : public gloo::rendezvous::Store {
 public:
  // `timeout` bounds get() and the wait() without a timeout.
  KeyValueGlooStore(std::shared_ptr<runtime::KeyValueClient> client, std::string prefix,
                    absl::Duration timeout);

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

  // The keys among `keys` that still have no value when `timeout` (one deadline for all of
  // them) has passed; empty when all arrived. Errors: the client's, other than
  // DEADLINE_EXCEEDED / NOT_FOUND (e.g. UNAVAILABLE).
  absl::StatusOr<std::vector<std::string>> Missing(const std::vector<std::string>& keys,
                                                   absl::Duration timeout);

  // Deletes every key this store has set (clean-up once all peers have read them). Keys
  // already gone are fine. Errors: the first failure of the client's Delete.
  absl::Status DeleteOwnKeys();

  std::string FullKey(absl::string_view key) const;

 private:
  const std::shared_ptr<runtime::KeyValueClient> client_;
  const std::string prefix_;
  const absl::Duration timeout_;
  absl::Mutex mu_;
  std::vector<std::string> own_keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun::worker::collectives
