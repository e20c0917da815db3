#!/usr/bin/env bash
# Sets up, builds and runs every test:
#   1. one clang build of everything with -Werror=thread-safety, AddressSanitizer and
#      UndefinedBehaviorSanitizer (build-sanitize), running the fuzzers, the unit tests and the
#      cluster tests;
#   2. a ThreadSanitizer build, running the unit tests without gRPC;
#   3. the regular build, running every other ctest test: the e2e and fault tests of step 1 do
#      not run twice.
# Any capability alone: ctest --test-dir build -L <label>
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
start=$(date +%s)
bash scripts/setup.sh

# One clang tree (scripts/build_sanitize.sh) for the thread-safety errors, ASan + UBSan, the
# libFuzzer targets and the tests: one cold build fewer than a tree for each.
bash scripts/build_sanitize.sh
echo "test: thread-safety analysis clean ($(( $(date +%s) - start ))s)"
# fuzz (issue 16): replay the committed crash inputs, then fuzz each target briefly
# (docs/fuzzing.md).
bash scripts/fuzz.sh --seconds 8 --no-build

ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-sanitize -L unit -j2 --output-on-failure
# fuzz (issue 16): every e2e and fault test against the ASan+UBSan binaries too, but
# recovery_test, whose waits for training progress are bounded for the regular build
# (docs/fuzzing.md). Leak checking is off there: the tests kill servers with SIGKILL on purpose.
sanitized=(-L 'e2e|fault' -E '^recovery_test$')
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 MESHRUN_MUTEX_DEADLOCK_CHECK=1 \
  ctest --test-dir build-sanitize "${sanitized[@]}" -j2 --output-on-failure
echo "test: sanitizer run clean ($(( $(date +%s) - start ))s)"

# fuzz (issue 16): ThreadSanitizer on the unit tests that do not use gRPC, with abseil's
# synchronization made visible by common/tsan_absl_shim.cc (docs/fuzzing.md). Only their
# targets are built.
tsan_tests=(common_test natural_order_test idle_watchdog_test logging_test watch_hub_test
            history_store_test coordinator_test jobspec_test spec_limits_test limits_test
            registry_claims_test goodput_test
            executable_store_limits_test)
CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 cmake -S "$root" -B "$root/build-tsan" -G Ninja \
  -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang -DMESHRUN_TSAN=ON \
  -DMESHRUN_BUILD_BENCH=OFF >/dev/null
CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 ninja -C "$root/build-tsan" -j"$(nproc)" "${tsan_tests[@]}"
# StalledWatcherDoesNotSlowPublish bounds a time ratio, which TSan's slowdown makes noise.
GTEST_FILTER='-*StalledWatcherDoesNotSlowPublish' TSAN_OPTIONS=halt_on_error=1 \
  ctest --test-dir build-tsan -j2 --output-on-failure \
  -R "^($(IFS='|'; echo "${tsan_tests[*]}"))\$"
echo "test: thread sanitizer run clean ($(( $(date +%s) - start ))s)"

bash scripts/build.sh build
echo "test: regular build done ($(( $(date +%s) - start ))s)"
# Every test but those that just passed on the sanitizer binaries: the e2e and fault tests ran a
# second time here before, ~5 of CI's 45 minutes (570 of 1560 test-seconds on 2026-11-28).
ran=$(ctest --test-dir build-sanitize -N "${sanitized[@]}" | sed -n 's/^ *Test *#[0-9]*: //p')
[ -n "$ran" ] || { echo "test: no sanitizer tests listed" >&2; exit 1; }
ctest --test-dir build -j2 --output-on-failure -E "^($(paste -sd'|' <<<"$ran"))\$"
echo "test: all done in $(( $(date +%s) - start ))s"
