#!/usr/bin/env bash
# Builds the clang check tree, build-sanitize: every library, binary, test and libFuzzer target
# with ASan + UBSan and libFuzzer's coverage (MESHRUN_FUZZ), and clang's thread-safety analysis
# as errors. One tree serves the thread-safety check, the fuzzers (scripts/fuzz.sh) and the
# sanitizer test runs (scripts/test.sh). Usage: build_sanitize.sh [targets...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
exec bash "$root/scripts/build.sh" build-sanitize -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_C_COMPILER=clang -DMESHRUN_THREAD_SAFETY=ON -DMESHRUN_FUZZ=ON \
  -DMESHRUN_BUILD_BENCH=OFF -- "$@"
