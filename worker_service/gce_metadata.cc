#include "worker_service/gce_metadata.h"

#include <httplib.h>
#include <spdlog/spdlog.h>

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace meshrun::services {
namespace {

// The value of `key` in tpu-env's "KEY: 'value'" lines.
std::optional<std::string> TpuEnvValue(const std::string& tpu_env, const std::string& key) {
  for (absl::string_view line : absl::StrSplit(tpu_env, '\n')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(line, absl::MaxSplits(':', 1));
    if (absl::StripAsciiWhitespace(kv.first) != key) continue;
    absl::string_view value = absl::StripAsciiWhitespace(kv.second);
    if (value.size() >= 2 && (value.front() == '\'' || value.front() == '"') &&
        value.back() == value.front()) {
      value = value.substr(1, value.size() - 2);
    }
    return std::string(value);
  }
  return std::nullopt;
}

}  // namespace

MetadataFetch GceMetadataFetch(std::string address, absl::Duration timeout) {
  return [address = std::move(address),
          timeout](const std::string& attribute) -> absl::StatusOr<std::string> {
    httplib::Client client(absl::StrCat("http://", address));
    const auto micros = absl::ToInt64Microseconds(timeout);
    client.set_connection_timeout(micros / 1000000, micros % 1000000);
    client.set_read_timeout(micros / 1000000, micros % 1000000);
    const std::string path = "/computeMetadata/v1/instance/attributes/" + attribute;
    httplib::Result result = client.Get(path, {{"Metadata-Flavor", "Google"}});
    if (!result) {
      return absl::UnavailableError(absl::StrCat("metadata server ", address, ": GET ", path,
                                                 ": ", httplib::to_string(result.error())));
    }
    if (result->status == 404) {
      return absl::NotFoundError(absl::StrCat("metadata server ", address, " has no ", path));
    }
    if (result->status != 200) {
      return absl::UnavailableError(absl::StrCat("metadata server ", address, ": GET ", path,
                                                 ": HTTP ", result->status));
    }
    return result->body;
  };
}

worker::EnvLookup WithTpuMetadata(worker::EnvLookup env, MetadataFetch fetch) {
  struct Cache {
    std::mutex mu;
    std::map<std::string, std::optional<std::string>> attributes;
  };
  auto cache = std::make_shared<Cache>();
  auto attribute = [cache, fetch](const std::string& name) -> std::optional<std::string> {
    std::lock_guard<std::mutex> lock(cache->mu);
    auto it = cache->attributes.find(name);
    if (it != cache->attributes.end()) return it->second;
    absl::StatusOr<std::string> value = fetch(name);
    if (!value.ok() && !absl::IsNotFound(value.status())) {
      spdlog::warn("TPU identity from the metadata server: {}", value.status().ToString());
    }
    std::optional<std::string> result;
    if (value.ok()) result = std::string(absl::StripAsciiWhitespace(*value));
    cache->attributes[name] = result;
    return result;
  };
  return [env = std::move(env), attribute](const std::string& name) -> std::optional<std::string> {
    if (std::optional<std::string> value = env(name)) return value;
    if (name == "TPU_WORKER_ID") return attribute("agent-worker-number");
    if (name == "TPU_ACCELERATOR_TYPE") return attribute("accelerator-type");
    if (name == "TPU_WORKER_HOSTNAMES") {
      std::optional<std::string> endpoints = attribute("worker-network-endpoints");
      if (!endpoints) return std::nullopt;
      std::vector<std::string> hosts;
      for (absl::string_view entry : absl::StrSplit(*endpoints, ',', absl::SkipWhitespace())) {
        std::vector<absl::string_view> fields = absl::StrSplit(entry, ':');
        hosts.emplace_back(fields.size() >= 3 ? fields[2] : fields.back());
      }
      return absl::StrJoin(hosts, ",");
    }
    if (name == "MEGASCALE_SLICE_ID" || name == "MEGASCALE_NUM_SLICES") {
      std::optional<std::string> tpu_env = attribute("tpu-env");
      if (!tpu_env) return std::nullopt;
      return TpuEnvValue(*tpu_env, name);
    }
    return std::nullopt;
  };
}

}  // namespace meshrun::services
