// runtime::KeyValueClient backed by the coordinator's key-value RPCs: what a worker hands its
// PJRT client so multi-host plugins rendezvous through the coordinator.
//
// Thread-safety: safe to call from any thread (gRPC stubs are). Lifetime: owns its stub.
#pragma once

#include <memory>
#include <string>

#include "meshrun/v1/coordinator.grpc.pb.h"
#include "runtime/kv_client.h"

namespace meshrun::services {

class CoordinatorKeyValueClient final : public runtime::KeyValueClient {
 public:
  // `rpc_slack` is added to each call's deadline beyond the wait it asks the server for.
  explicit CoordinatorKeyValueClient(std::shared_ptr<grpc::Channel> channel,
                                     absl::Duration rpc_slack = absl::Seconds(5));

  absl::StatusOr<std::string> Get(absl::string_view key, absl::Duration timeout) override;
  absl::StatusOr<std::string> TryGet(absl::string_view key) override;
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  absl::Status Delete(absl::string_view key) override;

 private:
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  const absl::Duration rpc_slack_;
};

}  // namespace meshrun::services
