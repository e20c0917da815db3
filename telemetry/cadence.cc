#include "telemetry/cadence.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace meshrun::telemetry {

absl::StatusOr<Cadence> Cadence::Create(int64_t every_n_steps) {
  if (every_n_steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "telemetry_cadence is ", every_n_steps, "; it must be >= 1 (log every N steps)"));
  }
  return Cadence(every_n_steps);
}

}  // namespace meshrun::telemetry
