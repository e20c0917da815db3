#include "runtime/identity.h"

#include "absl/strings/str_cat.h"

namespace meshrun::runtime {

std::string ToString(const RuntimeIdentity& identity) {
  if (identity.empty()) return "none";
  // libtpu's version spans lines ("TFRT TPU v6 lite\nBuilt on ..."): the first says enough.
  const absl::string_view version =
      absl::string_view(identity.platform_version).substr(0, identity.platform_version.find('\n'));
  return absl::StrCat(identity.platform_name, " ", version, " (PJRT ",
                      identity.pjrt_api_major, ".", identity.pjrt_api_minor, ", plugin ",
                      identity.plugin_sha256.substr(0, 8), ")");
}

}  // namespace meshrun::runtime
