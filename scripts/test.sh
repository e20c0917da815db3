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
  -DMESHRUN_THREAD_SAFETY=ON -DMESHRUN_BUILD_TESTS=OFF -DMESHRUN_BUILD_BENCH=OFF
echo "test: thread-safety analysis clean"

bash scripts/build.sh build-asan -DMESHRUN_SANITIZE=ON -DMESHRUN_BUILD_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan -L unit -j2 --output-on-failure
echo "test: sanitizer run clean"

bash scripts/build.sh build
ctest --test-dir build -j2 --output-on-failure
echo "test: all done in $(( $(date +%s) - start ))s"
