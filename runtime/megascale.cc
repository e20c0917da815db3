#include "runtime/megascale.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace meshrun::runtime {
namespace {

absl::StatusOr<int> ParsePort(absl::string_view what, absl::string_view text) {
  int port = 0;
  if (!absl::SimpleAtoi(text, &port) || port < 1 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " is \"", text, "\"; use a port number 1..65535"));
  }
  return port;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> MegascaleEnvironment(
    const MegascaleConfig& config) {
  return {{"MEGASCALE_COORDINATOR_ADDRESS", config.coordinator_address},
          {"MEGASCALE_NUM_SLICES", absl::StrCat(config.num_slices)},
          {"MEGASCALE_PORT", absl::StrCat(config.port)},
          {"MEGASCALE_SLICE_ID", absl::StrCat(config.slice_id)}};
}

absl::StatusOr<std::optional<MegascaleConfig>> ResolveMegascale(const MegascaleInputs& inputs,
                                                                const EnvironmentLookup& env) {
  if (inputs.num_slices <= 1) return std::nullopt;
  MegascaleConfig config{.port = inputs.flag_port,
                         .slice_id = inputs.slice_id,
                         .num_slices = inputs.num_slices};
  if (config.port < 1 || config.port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--megascale_port is ", config.port,
                                                   "; use a port number 1..65535"));
  }
  std::string address = inputs.flag_coordinator;
  std::string source = "--megascale_coordinator";
  if (std::optional<std::string> value = env("MEGASCALE_COORDINATOR_ADDRESS");
      value.has_value() && !value->empty()) {
    address = *value;
    source = "MEGASCALE_COORDINATOR_ADDRESS";
  }
  // "host:port" (not an IPv6 literal without brackets): the port part, unless MEGASCALE_PORT.
  std::optional<std::string> address_port;
  if (const size_t colon = address.rfind(':');
      colon != std::string::npos && address.find(':') == colon) {
    address_port = address.substr(colon + 1);
    address.resize(colon);
  } else if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, " \"", address, "\" has no closing ']'"));
    }
    if (close + 1 < address.size()) {
      if (address[close + 1] != ':') {
        return absl::InvalidArgumentError(absl::StrCat(
            source, " \"", address, "\": expected HOST, HOST:PORT or [IPv6]:PORT"));
      }
      address_port = address.substr(close + 2);
    }
    address = address.substr(1, close - 1);
  }
  if (address_port.has_value()) {
    absl::StatusOr<int> port = ParsePort(absl::StrCat("the port of ", source), *address_port);
    if (!port.ok()) return port.status();
    config.port = *port;
  }
  if (std::optional<std::string> value = env("MEGASCALE_PORT"); value && !value->empty()) {
    absl::StatusOr<int> port = ParsePort("MEGASCALE_PORT", *value);
    if (!port.ok()) return port.status();
    config.port = *port;
  }
  if (address.empty() && inputs.slice_id == 0) {
    if (!inputs.slice_hostnames.empty()) {
      address = inputs.slice_hostnames.front();
    } else if (inputs.worker_index == 0) {
      address = inputs.host;
    }
  }
  if (address.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "host ", inputs.host, " is in slice ", inputs.slice_id, " of ", inputs.num_slices,
        " but the megascale coordinator is unknown: set MEGASCALE_COORDINATOR_ADDRESS or "
        "--megascale_coordinator to the host name of slice 0's worker 0"));
  }
  config.coordinator_address = address;
  return config;
}

absl::Status ExportMegascaleEnvironment(const MegascaleConfig& config) {
  for (const auto& [name, value] : MegascaleEnvironment(config)) {
    if (setenv(name.c_str(), value.c_str(), /*overwrite=*/1) != 0) {
      return absl::InternalError(absl::StrCat("setenv ", name, ": ", std::strerror(errno)));
    }
  }
  return absl::OkStatus();
}

}  // namespace meshrun::runtime
