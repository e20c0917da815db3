#!/usr/bin/env bash
# Runs every libFuzzer target (fuzz/, docs/fuzzing.md) for a bounded time each.
#   scripts/fuzz.sh [--seconds N] [--build DIR] [--no-build] [target ...]  (targets: job_spec, ...)
# Builds the fuzz targets in DIR (default build-sanitize, scripts/build_sanitize.sh: clang,
# ASan+UBSan, libFuzzer coverage; the tree CI's thread-safety and sanitizer steps use), writes each target's seeds from
# examples/, replays the committed regression inputs (fuzz/regressions/<target>/), then fuzzes
# for N seconds (default 60) keeping new inputs in DIR/fuzz-corpus/<target>. Prints one line
# per target, "fuzz: <target> <executions> executions <crashes> crashes", and fails on any
# crash (the input is saved in DIR/fuzz-crashes/<target>/: fix it, then commit the input under
# fuzz/regressions/<target>/).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds=60
build=build-sanitize
no_build=0
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --build) build="$2"; shift 2 ;;
    --no-build) no_build=1; shift ;;
    -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  targets=(job_spec job_bundle token_shards telemetry http_query key_value executable_chunks)
fi
dir="$root/$build"
if [ "$no_build" = 0 ]; then
  if [ "$build" = build-sanitize ]; then
    bash "$root/scripts/build_sanitize.sh" "${targets[@]/%/_fuzz}" >/dev/null
  else
    CCACHE_BASEDIR="$root" CCACHE_NOHASHDIR=1 ninja -C "$dir" -j"$(nproc)" "${targets[@]/%/_fuzz}" >/dev/null
  fi
fi

# Leaks are errors; UBSan findings stop the run like ASan's.
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
failed=0
total=0
for t in "${targets[@]}"; do
  bin="$dir/fuzz/${t}_fuzz"
  seeds="$dir/fuzz-corpus/$t/seeds"
  work="$dir/fuzz-corpus/$t/work"
  crashes="$dir/fuzz-crashes/$t"
  regressions="$root/fuzz/regressions/$t"
  rm -rf "$seeds"
  mkdir -p "$work" "$crashes"
  MESHRUN_FUZZ_SEEDS="$seeds" "$bin" 2>/dev/null
  log="$dir/fuzz-crashes/$t.log"
  if [ -d "$regressions" ] && [ -n "$(ls -A "$regressions")" ]; then
    if ! "$bin" "$regressions"/* >"$log" 2>&1; then
      echo "fuzz: $t FAILS a committed regression input; log: $log"
      tail -30 "$log"
      failed=1
      continue
    fi
  fi
  dirs=("$work" "$seeds")
  [ -d "$regressions" ] && dirs+=("$regressions")
  status=0
  "$bin" -max_total_time="$seconds" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$crashes/" "${dirs[@]}" >"$log" 2>&1 || status=$?
  execs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)"
  execs="${execs:-0}"
  total=$((total + execs))
  found="$(find "$crashes" -type f | wc -l)"
  echo "fuzz: $t $execs executions $found crashes"
  if [ "$status" -ne 0 ] || [ "$found" -ne 0 ]; then
    echo "fuzz: $t failed (exit $status); inputs in $crashes, log $log:"
    grep -E 'ERROR|SUMMARY|fuzz:|#[0-9]+ 0x' "$log" | head -30 || true
    failed=1
  fi
done
echo "fuzz: ${#targets[@]} targets, $total executions in total"
exit "$failed"
