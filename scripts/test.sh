#!/usr/bin/env bash
# Sets up, builds and runs every test:
#   1. clang compile of every library and binary with -Werror=thread-safety;
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build, running the unit tests;
#   3. the regular build, running every ctest test (all capabilities).
# Any capability alone: ctest --test-dir build -L <label>
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
start=$(date +%s)
bash scripts/setup.sh

bash scripts/build.sh build-tsa -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang \
  -DMESHRUN_THREAD_SAFETY=ON -DMESHRUN_BUILD_TESTS=OFF -DMESHRUN_BUILD_BENCH=OFF -DMESHRUN_FUZZ=ON
echo "test: thread-safety analysis clean"
# fuzz (issue 16): the clang tree above also builds the libFuzzer targets (ASan+UBSan); replay
# the committed crash inputs, then fuzz each target briefly (docs/fuzzing.md).
bash scripts/fuzz.sh --seconds 8

bash scripts/build.sh build-asan -DMESHRUN_SANITIZE=ON -DMESHRUN_BUILD_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L unit -j2 --output-on-failure
# fuzz (issue 16): cluster tests against the ASan+UBSan binaries too, a representative subset
# (hostile clients, a job's whole lifecycle with kill -9 and a coordinator restart, a restarted
# worker). Leak checking is off there: the tests kill servers with SIGKILL on purpose.
ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -R '^(hostile_client_test|job_lifecycle_test|worker_restart_test)$' \
  -j2 --output-on-failure
echo "test: sanitizer run clean"

bash scripts/build.sh build
ctest --test-dir build -j2 --output-on-failure
echo "test: all done in $(( $(date +%s) - start ))s"
