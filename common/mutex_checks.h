// Debian builds abseil without NDEBUG, so by default every absl::Mutex::Lock, ours and gRPC's,
// runs abseil's deadlock detector: it records the lock-order graph behind one process-wide
// lock. That is a debugging aid, off in release builds of abseil. Product binaries and the
// benchmarks turn it off at start; in-process tests keep abseil's default.
//
// Call first thing in main, before any thread starts. Thread-safety: not for concurrent use.
#pragma once

namespace meshrun {

// Turns the deadlock detector off unless the environment sets MESHRUN_MUTEX_DEADLOCK_CHECK=1
// (the test command's sanitizer stage does, for the binaries its cluster tests start).
void ConfigureMutexDeadlockDetection();

}  // namespace meshrun
