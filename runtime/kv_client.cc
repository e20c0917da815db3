#include "runtime/kv_client.h"

#include "absl/strings/str_cat.h"

namespace meshrun::runtime {

absl::StatusOr<std::string> KeyValueClient::TryGet(absl::string_view key) {
  absl::StatusOr<std::string> value = Get(key, absl::ZeroDuration());
  if (absl::IsDeadlineExceeded(value.status())) {
    return absl::NotFoundError(absl::StrCat("key '", key, "' has no value"));
  }
  return value;
}

absl::Status KeyValueClient::Delete(absl::string_view key) {
  return absl::UnimplementedError(absl::StrCat("this key-value store cannot delete '", key, "'"));
}

absl::StatusOr<std::string> InMemoryKeyValueClient::Get(absl::string_view key,
                                                        absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto has_key = [this, key]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return values_.find(key) != values_.end();
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&has_key), timeout)) {
    return absl::DeadlineExceededError(
        absl::StrCat("key '", key, "' has no value after ", absl::FormatDuration(timeout)));
  }
  return values_.find(key)->second;
}

absl::StatusOr<std::string> InMemoryKeyValueClient::TryGet(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key '", key, "' has no value"));
  return it->second;
}

absl::Status InMemoryKeyValueClient::Set(absl::string_view key, absl::string_view value) {
  absl::MutexLock lock(&mu_);
  values_.insert_or_assign(std::string(key), std::string(value));
  return absl::OkStatus();
}

absl::Status InMemoryKeyValueClient::Delete(absl::string_view key) {
  absl::MutexLock lock(&mu_);
  auto it = values_.find(key);
  if (it == values_.end()) return absl::NotFoundError(absl::StrCat("key '", key, "' has no value"));
  values_.erase(it);
  return absl::OkStatus();
}

}  // namespace meshrun::runtime
