#include "worker/collectives/kv_gloo_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gloo/common/error.h"

namespace meshrun::worker::collectives {

KeyValueGlooStore::KeyValueGlooStore(std::shared_ptr<runtime::KeyValueClient> client,
                                     std::string prefix, absl::Duration timeout)
    : client_(std::move(client)), prefix_(std::move(prefix)), timeout_(timeout) {}

std::string KeyValueGlooStore::FullKey(absl::string_view key) const {
  return absl::StrCat(prefix_, "/", key);
}

void KeyValueGlooStore::set(const std::string& key, const std::vector<char>& data) {
  const std::string full = FullKey(key);
  absl::Status status = client_->Set(full, absl::string_view(data.data(), data.size()));
  if (!status.ok()) {
    throw gloo::IoException(
        absl::StrCat("rendezvous store: set '", full, "': ", status.ToString()));
  }
  absl::MutexLock l(&mu_);
  own_keys_.push_back(full);
}

std::vector<char> KeyValueGlooStore::get(const std::string& key) {
  const std::string full = FullKey(key);
  absl::StatusOr<std::string> value = client_->Get(full, timeout_);
  if (!value.ok()) {
    throw gloo::IoException(
        absl::StrCat("rendezvous store: get '", full, "': ", value.status().ToString()));
  }
  return std::vector<char>(value->begin(), value->end());
}

void KeyValueGlooStore::wait(const std::vector<std::string>& keys) {
  wait(keys, std::chrono::milliseconds(absl::ToInt64Milliseconds(timeout_)));
}

void KeyValueGlooStore::wait(const std::vector<std::string>& keys,
                             const std::chrono::milliseconds& timeout) {
  absl::StatusOr<std::vector<std::string>> missing =
      Missing(keys, absl::Milliseconds(timeout.count()));
  if (!missing.ok()) {
    throw gloo::IoException(absl::StrCat("rendezvous store: ", missing.status().ToString()));
  }
  if (!missing->empty()) {
    std::vector<std::string> full;
    for (const std::string& key : *missing) full.push_back(FullKey(key));
    throw gloo::IoException(absl::StrCat(
        "rendezvous store: no value for '", absl::StrJoin(full, "', '"), "' after ",
        absl::FormatDuration(absl::Milliseconds(timeout.count()))));
  }
}

absl::StatusOr<std::vector<std::string>> KeyValueGlooStore::Missing(
    const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::vector<std::string> missing;
  for (const std::string& key : keys) {
    const std::string full = FullKey(key);
    // Past the deadline every remaining key is only checked, so all absentees are named.
    absl::StatusOr<std::string> value =
        client_->Get(full, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (value.ok()) continue;
    if (!absl::IsDeadlineExceeded(value.status()) && !absl::IsNotFound(value.status())) {
      return absl::Status(value.status().code(),
                          absl::StrCat("waiting for '", full, "': ", value.status().message()));
    }
    missing.push_back(key);
  }
  return missing;
}

absl::Status KeyValueGlooStore::DeleteOwnKeys() {
  std::vector<std::string> keys;
  {
    absl::MutexLock l(&mu_);
    keys.swap(own_keys_);
  }
  absl::Status first;
  for (const std::string& key : keys) {
    absl::Status status = client_->Delete(key);
    if (!status.ok() && !absl::IsNotFound(status) && first.ok()) first = status;
  }
  return first;
}

}  // namespace meshrun::worker::collectives
