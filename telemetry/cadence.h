// The telemetry cadence: which steps are logging steps. Steps count from 1; step s logs when
// s is a multiple of the cadence, so 1000 steps at cadence 100 log exactly 10 times.
//
// Immutable value; thread-safe.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace meshrun::telemetry {

class Cadence {
 public:
  // Errors: INVALID_ARGUMENT when every_n_steps < 1 (naming telemetry_cadence).
  static absl::StatusOr<Cadence> Create(int64_t every_n_steps);

  bool IsLoggingStep(int64_t step) const { return step > 0 && step % every_n_steps_ == 0; }
  int64_t every_n_steps() const { return every_n_steps_; }

 private:
  explicit Cadence(int64_t every_n_steps) : every_n_steps_(every_n_steps) {}
  int64_t every_n_steps_;
};

}  // namespace meshrun::telemetry
