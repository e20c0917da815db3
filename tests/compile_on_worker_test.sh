#!/usr/bin/env bash
# A coordinator without the job's PJRT plugin (as on a CPU-only control host of a TPU slice):
#   1. `meshrun workers` says why a host without a runtime is excluded from the pin;
#   2. the job compiles once on its worker, which keeps the executable: the manifest says
#      compiled_on that worker and no executable bytes were sent back to it;
#   3. a resubmission is a cache hit and compiles nowhere.
# Usage: compile_on_worker_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/mlp_classifier/dp8/job.json"
source "$(dirname "$0")/cluster_lib.sh"

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" --pjrt_plugin= \
  >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"

"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=tpu-host-0 \
  --state_dir="$tmp/worker" >"$tmp/worker.log" 2>&1 &
pids+=($!)
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=no-plugin \
  --worker_index=1 --pjrt_plugin= --state_dir="$tmp/bare" >"$tmp/bare.log" 2>&1 &
pids+=($!)
cli workers --expect=2 --wait=30s >"$tmp/workers.txt" || fail "workers did not register"

# 1. The bare host is listed with the reason it cannot take jobs; the other is not excluded.
grep "^no-plugin " "$tmp/workers.txt" | grep -q "excluded: .*runtime" \
  || fail "no exclusion reason for the host without a runtime: $(cat "$tmp/workers.txt")"
grep "^tpu-host-0 " "$tmp/workers.txt" | grep -q "excluded" && fail "eligible host shown excluded"
if cli workers --job=job-404 >"$tmp/bad.txt" 2>&1; then fail "unknown job accepted"; fi
grep -q "job-404" "$tmp/bad.txt" || fail "unknown job not named: $(cat "$tmp/bad.txt")"

# 2. Compiled on the worker, nothing streamed back to it.
cli submit "$bundle" --steps=20 --cadence=10 --follow --output=textproto --wait=120s >"$tmp/job1.txt" \
  || fail "job did not succeed: $(cat "$tmp/job1.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job1.txt" || fail "job state"
[ "$(field compiled_on <"$tmp/job1.txt")" = "tpu-host-0" ] || fail "not compiled on the worker"
grep -q "executable_bytes_sent" "$tmp/job1.txt" && fail "executables sent to the worker that made them"
grep -q "compiled program step for the coordinator" "$tmp/worker.log" || fail "worker did not compile"
cli workers --job=job-1 >"$tmp/workers.txt" || fail "workers --job failed"
grep "^no-plugin " "$tmp/workers.txt" | grep -q "excluded" || fail "job pin exclusion missing"

# 3. The coordinator's persistent cache now holds them: no second compile anywhere.
cli submit "$bundle" --steps=20 --cadence=10 --follow --output=textproto --wait=120s >"$tmp/job2.txt" \
  || fail "second job did not succeed: $(cat "$tmp/job2.txt")"
grep -q "cache_hit: true" "$tmp/job2.txt" || fail "no cache hit"
grep -q "compiled_on" "$tmp/job2.txt" && fail "a cache hit compiled again"
[ "$(grep -c "compiled program" "$tmp/worker.log")" -eq 2 ] || fail "worker compiled more than init and step"
echo "compile_on_worker_test: all checks passed"
