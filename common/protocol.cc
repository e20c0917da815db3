#include "common/protocol.h"

#include "absl/strings/str_cat.h"

namespace meshrun {

absl::Status CheckProtocolVersion(uint32_t peer_version) {
  if (peer_version >= kProtocolMinVersion && peer_version <= kProtocolMaxVersion) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "protocol version ", peer_version, " is not supported; this build speaks versions ",
      kProtocolMinVersion, " to ", kProtocolMaxVersion, ": upgrade the older side"));
}

}  // namespace meshrun
