#include "common/mutex_checks.h"

#include <cstdlib>
#include <cstring>

#include "absl/synchronization/mutex.h"

namespace meshrun {

void ConfigureMutexDeadlockDetection() {
  const char* keep = std::getenv("MESHRUN_MUTEX_DEADLOCK_CHECK");
  if (keep != nullptr && std::strcmp(keep, "1") == 0) return;
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace meshrun
