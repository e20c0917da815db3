// ThreadSanitizer build only (MESHRUN_TSAN, docs/fuzzing.md): tells TSan about the
// synchronization of Debian's prebuilt abseil, which is not instrumented, so TSan would
// otherwise report every access guarded by absl::Mutex as a race.
//
// Each definition below interposes the library's own symbol (test executables link with
// -rdynamic, so the library's callers reach these too), calls the library's function through
// dlsym(RTLD_NEXT) and marks the happens-before edge: a lock or a finished wait acquires the
// mutex's address, an unlock or the start of a wait releases it. A conditional wait
// (Await, LockWhen, MutexLock with a Condition) is turned into polling under the lock, since the
// library evaluates a waiter's Condition in whichever thread unlocks, where TSan cannot see it.
// That makes conditional waits wake up to 1 ms late in this build only.
//
// The mangled names are those of Debian 12's abseil 20220623 (inline namespace debian3); a
// name the library lacks traps at first use.
#include <dlfcn.h>

#include <algorithm>
#include <cstring>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

template <typename F>
F Real(const char* mangled) {
  void* symbol = dlsym(RTLD_NEXT, mangled);
  if (symbol == nullptr) __builtin_trap();
  F f;
  static_assert(sizeof(f) == sizeof(symbol));
  std::memcpy(&f, &symbol, sizeof(f));
  return f;
}

void Acquire(const void* addr) { __tsan_acquire(const_cast<void*>(addr)); }
void Release(const void* addr) { __tsan_release(const_cast<void*>(addr)); }

constexpr absl::Duration kPoll = absl::Milliseconds(1);

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

void Mutex::Lock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex4LockEv");
  real(this);
  Acquire(this);
}

void Mutex::ReaderLock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  Acquire(this);
}

bool Mutex::TryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

bool Mutex::ReaderTryLock() {
  static auto real = Real<bool (*)(Mutex*)>("_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) Acquire(this);
  return locked;
}

void Mutex::Unlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex6UnlockEv");
  Release(this);
  real(this);
}

void Mutex::ReaderUnlock() {
  static auto real = Real<void (*)(Mutex*)>("_ZN4absl7debian35Mutex12ReaderUnlockEv");
  Release(this);
  real(this);
}

// The conditional waits, as polling under the lock (see the top of the file).
bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  static auto wait = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  static CondVar never_signalled;
  while (!cond.Eval()) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) return false;
    Release(this);
    wait(&never_signalled, this, std::min(left, kPoll));
    Acquire(this);
  }
  return true;
}
void Mutex::Await(const Condition& cond) { AwaitWithDeadline(cond, absl::InfiniteFuture()); }
bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  return AwaitWithDeadline(cond, absl::Now() + timeout);
}
void Mutex::LockWhen(const Condition& cond) {
  Lock();
  Await(cond);
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  Lock();
  return AwaitWithDeadline(cond, deadline);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  return LockWhenWithDeadline(cond, absl::Now() + timeout);
}
void Mutex::ReaderLockWhen(const Condition& cond) { LockWhen(cond); }
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  return LockWhenWithDeadline(cond, deadline);
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  return LockWhenWithTimeout(cond, timeout);
}

void CondVar::Wait(Mutex* mu) {
  static auto real = Real<void (*)(CondVar*, Mutex*)>("_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  Release(mu);
  real(this, mu);
  Acquire(mu);
}

bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Duration)>(
      "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  Release(mu);
  const bool timed_out = real(this, mu, timeout);
  Acquire(mu);
  return timed_out;
}

bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  static auto real = Real<bool (*)(CondVar*, Mutex*, absl::Time)>(
      "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  Release(mu);
  const bool timed_out = real(this, mu, deadline);
  Acquire(mu);
  return timed_out;
}

// HasBeenNotified() is inline (an atomic load TSan sees in our code): it acquires
// notified_yet_, so Notify releases that too.
void Notification::Notify() {
  static auto real = Real<void (*)(Notification*)>("_ZN4absl7debian312Notification6NotifyEv");
  Release(this);
  Release(&notified_yet_);
  real(this);
}

void Notification::WaitForNotification() const {
  static auto real =
      Real<void (*)(const Notification*)>("_ZNK4absl7debian312Notification19WaitForNotificationEv");
  real(this);
  Acquire(this);
}

bool Notification::WaitForNotificationWithTimeout(absl::Duration timeout) const {
  static auto real = Real<bool (*)(const Notification*, absl::Duration)>(
      "_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE");
  const bool notified = real(this, timeout);
  if (notified) Acquire(this);
  return notified;
}

bool Notification::WaitForNotificationWithDeadline(absl::Time deadline) const {
  static auto real = Real<bool (*)(const Notification*, absl::Time)>(
      "_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE");
  const bool notified = real(this, deadline);
  if (notified) Acquire(this);
  return notified;
}

ABSL_NAMESPACE_END
}  // namespace absl
