// What a host's PJRT runtime is and which devices it has: plain values shared by the worker,
// the coordinator's registry and planner, and the runtime backends.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace meshrun::runtime {

// Part of every compile-cache key and job manifest: an executable is valid only for the
// identity that compiled it. All fields empty means "no runtime loaded".
struct RuntimeIdentity {
  std::string platform_name;     // "cpu", "tpu"
  std::string platform_version;
  uint32_t pjrt_api_major = 0;
  uint32_t pjrt_api_minor = 0;
  std::string plugin_sha256;

  bool empty() const { return platform_name.empty() && plugin_sha256.empty(); }
  friend bool operator==(const RuntimeIdentity&, const RuntimeIdentity&) = default;
};

// "cpu 0.5.1 (PJRT 0.67, plugin 1a2b3c4d)" — short form for tables and errors.
std::string ToString(const RuntimeIdentity& identity);

struct DeviceDescription {
  int32_t global_id = 0;
  int32_t local_id = 0;
  int32_t process_index = 0;
  std::string kind;           // "TPU v6 lite", "cpu"
  std::string runtime_name;   // "TPU:3", "cpu:5"
  std::vector<int32_t> coords;
  std::map<std::string, std::string> attributes;
};

}  // namespace meshrun::runtime
