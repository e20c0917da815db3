// Helpers shared by the files that implement StepLoop (step_loop*.cc); not part of its API.
#pragma once

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace meshrun::worker {

// `status` with `prefix` before its message ("step 3: ..."), code kept.
inline absl::Status PrefixStatus(const absl::Status& status, absl::string_view prefix) {
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

}  // namespace meshrun::worker
