// SHA-256 through OpenSSL (which gRPC already brings). Digests are lowercase hex.
//
// Thread-safety: the free functions are safe to call concurrently; one Sha256 object must
// not be used from two threads at once.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace meshrun {

// Incremental hashing for data that arrives in pieces (executable chunks, files).
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(absl::string_view data);
  // Returns the hex digest; the object is reset and can hash again.
  std::string HexDigest();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

std::string Sha256Hex(absl::string_view data);

// Errors: NOT_FOUND or PERMISSION_DENIED (cannot open, path named), DATA_LOSS (read failed).
absl::StatusOr<std::string> Sha256File(const std::string& path);

}  // namespace meshrun
