// The key-value store a PJRT plugin uses to exchange start-up data between hosts (multi-host
// TPU topology discovery). The worker backs it with the coordinator's KeyValue RPCs; the
// runtime hands it to the plugin as PJRT_Client_Create's kv callbacks, and worker/collectives
// rendezvous gloo through it.
//
// Thread-safety: implementations must be safe to call from any thread (the plugin calls them
// from its own threads). Lifetime: a runtime keeps a shared_ptr to its client.
#pragma once

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace meshrun::runtime {

class KeyValueClient {
 public:
  virtual ~KeyValueClient() = default;

  // Blocks until `key` has a value or `timeout` passes.
  // Errors: DEADLINE_EXCEEDED (no value in time), UNAVAILABLE (store unreachable).
  virtual absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) = 0;

  // Returns at once. Errors: NOT_FOUND (no value), UNAVAILABLE.
  // Default: Get with a zero timeout, DEADLINE_EXCEEDED reported as NOT_FOUND.
  virtual absl::StatusOr<std::string> TryGet(absl::string_view key);

  // Errors: UNAVAILABLE (store unreachable).
  virtual absl::Status Set(absl::string_view key, absl::string_view value) = 0;

  // Removes `key` (rendezvous clean-up). Errors: NOT_FOUND (no such key), UNAVAILABLE;
  // UNIMPLEMENTED by default (a store that cannot delete).
  virtual absl::Status Delete(absl::string_view key);
};

// A store inside one process: for single-host runs and tests.
class InMemoryKeyValueClient final : public KeyValueClient {
 public:
  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<std::string> TryGet(absl::string_view key) override;
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::Status Delete(absl::string_view key) override;

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string, std::less<>> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace meshrun::runtime
