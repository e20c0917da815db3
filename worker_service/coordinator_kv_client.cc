#include "worker_service/coordinator_kv_client.h"

#include "common/grpc_status.h"
#include "rpc/server_support.h"

namespace meshrun::services {

CoordinatorKeyValueClient::CoordinatorKeyValueClient(std::shared_ptr<grpc::Channel> channel,
                                                     absl::Duration rpc_slack)
    : stub_(v1::Coordinator::NewStub(std::move(channel))), rpc_slack_(rpc_slack) {}

absl::StatusOr<std::string> CoordinatorKeyValueClient::Get(absl::string_view key,
                                                           absl::Duration timeout) {
  v1::KeyValueGetRequest request;
  request.set_key(std::string(key));
  request.set_timeout_millis(absl::ToInt64Milliseconds(timeout));
  v1::KeyValueGetResponse response;
  auto context = ContextWithTimeout(timeout + rpc_slack_);
  absl::Status status = FromGrpcStatus(stub_->KeyValueGet(context.get(), request, &response));
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

absl::StatusOr<std::string> CoordinatorKeyValueClient::TryGet(absl::string_view key) {
  v1::KeyValueGetRequest request;
  request.set_key(std::string(key));
  v1::KeyValueGetResponse response;
  auto context = ContextWithTimeout(rpc_slack_);
  absl::Status status = FromGrpcStatus(stub_->KeyValueTryGet(context.get(), request, &response));
  if (!status.ok()) return status;
  return std::move(*response.mutable_value());
}

absl::Status CoordinatorKeyValueClient::Set(absl::string_view key, absl::string_view value) {
  v1::KeyValueSetRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  request.set_allow_overwrite(true);  // PJRT plugins re-publish on retry
  v1::KeyValueSetResponse response;
  auto context = ContextWithTimeout(rpc_slack_);
  return FromGrpcStatus(stub_->KeyValueSet(context.get(), request, &response));
}

absl::Status CoordinatorKeyValueClient::Delete(absl::string_view key) {
  v1::KeyValueDeleteRequest request;
  request.set_key(std::string(key));
  v1::KeyValueDeleteResponse response;
  auto context = ContextWithTimeout(rpc_slack_);
  return FromGrpcStatus(stub_->KeyValueDelete(context.get(), request, &response));
}

}  // namespace meshrun::services
