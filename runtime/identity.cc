#include "runtime/identity.h"

#include "absl/strings/str_cat.h"

namespace meshrun::runtime {

std::string ToString(const RuntimeIdentity& identity) {
  if (identity.empty()) return "none";
  return absl::StrCat(identity.platform_name, " ", identity.platform_version, " (PJRT ",
                      identity.pjrt_api_major, ".", identity.pjrt_api_minor, ", plugin ",
                      identity.plugin_sha256.substr(0, 8), ")");
}

}  // namespace meshrun::runtime
