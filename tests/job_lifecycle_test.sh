#!/usr/bin/env bash
# A real job through the real binaries on loopback: a coordinator and two workers (8 CPU
# devices each, XLA's CPU PJRT plugin), the MLP bundle submitted with the CLI.
#   1. it SUCCEEDS, compiled once (cache miss) and streamed to the chosen worker;
#   2. a bad submission is refused naming the field, and the coordinator is unharmed;
#   3. a long job is cancelled and every worker stops;
#   4. kill -9 of a running job's worker FAILS the job naming that worker within 2T;
#   5. after a coordinator restart on the same state directory a resubmission is a cache hit
#      and sends 0 executable bytes to the worker that already holds them.
# Usage: job_lifecycle_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/mlp_classifier/dp8/job.json"
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$bundle" ] || fail "bundle $bundle missing"

timeout_s=2   # heartbeat timeout T
start_coordinator() {
  "$bin/meshrun-coordinator" --listen="127.0.0.1:$(stable_port)" --state_dir="$tmp/coordinator" \
    --heartbeat_timeout=${timeout_s}s >"$tmp/coordinator-$1.log" 2>&1 &
  coordinator=$!; pids+=("$coordinator")
  await_coordinator "$tmp/coordinator-$1.log"
}
# The job's state, e.g. JOB_STATE_RUNNING (sed reads everything: no SIGPIPE under pipefail).
state_of() { cli --output=textproto get "$1" | sed -n 's/^state: //p'; }
# Waits (bounded by $2 tenths of a second) until job $1 is in state $3.
wait_state() { for _ in $(seq "$2"); do [ "$(state_of "$1")" = "$3" ] && return 0; sleep 0.1; done; return 1; }

start_coordinator 1
# Workers find a restarted coordinator on the same port (a stable_port, see cluster_lib.sh).
for w in 0 1; do
  "$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host="worker-$w" \
    --worker_index=$w --state_dir="$tmp/worker-$w" >"$tmp/worker-$w.log" 2>&1 &
  pids+=($!)
done
cli workers --expect=2 --wait=30s >/dev/null || fail "workers did not register"

# 1. Success.
cli submit "$bundle" --steps=40 --cadence=10 --follow --output=textproto --wait=120s >"$tmp/job1.txt" \
  || fail "job 1 did not succeed: $(cat "$tmp/job1.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job1.txt" || fail "job 1 state"
grep -q "cache_hit: true" "$tmp/job1.txt" && fail "job 1 should compile (cache miss)"
[ "$(field last_step <"$tmp/job1.txt")" = "40" ] || fail "job 1 last_step"
sent=$(field executable_bytes_sent <"$tmp/job1.txt")
[ -n "$sent" ] && [ "$sent" -gt 0 ] || fail "job 1 sent no executable bytes"
grep -q 'compile_mode: "A"' "$tmp/job1.txt" || fail "job 1 compile mode"
host1=$(sed -n 's/.*key: "\(worker-[01]\)".*/\1/p' "$tmp/job1.txt" | head -1)

# Its telemetry replays from history (steps 10..40 at cadence 10) and the stream ends with it.
cli watch job-1 --since_step=1 >"$tmp/watch.txt" || fail "watch failed: $(cat "$tmp/watch.txt")"
[ "$(awk '$1 ~ /^[0-9]+$/' "$tmp/watch.txt" | wc -l)" -eq 4 ] || fail "watch rows: $(cat "$tmp/watch.txt")"
grep -q "loss" "$tmp/watch.txt" || fail "watch has no loss column"
# Metrics and memory of the worker that ran it, through the coordinator.
cli metrics "$host1" >"$tmp/metrics.txt" || fail "metrics failed"
grep -q "ExecuteTime" "$tmp/metrics.txt" && grep -q "LoadTime" "$tmp/metrics.txt" \
  || fail "metrics report incomplete: $(cat "$tmp/metrics.txt")"
cli memory "$host1" cpu:0 >"$tmp/memory.txt" || fail "memory failed"
grep -q "not reported by this plugin" "$tmp/memory.txt" || fail "memory: $(cat "$tmp/memory.txt")"
if cli memory "$host1" cpu:99 >"$tmp/memory.txt" 2>&1; then fail "unknown device accepted"; fi
grep -q "cpu:99" "$tmp/memory.txt" || fail "unknown device not named: $(cat "$tmp/memory.txt")"

# 2. Bad input: refused at submit, naming the field; the coordinator keeps serving.
if cli submit "$bundle" --cadence=0 >"$tmp/bad.txt" 2>&1; then fail "cadence 0 accepted"; fi
grep -q "cadence" "$tmp/bad.txt" || fail "cadence refusal unclear: $(cat "$tmp/bad.txt")"
[ "$("$bin/meshrun" health "127.0.0.1:$port")" = "SERVING" ] || fail "coordinator harmed"

# 3. Cancel a long job.
job=$(cli submit "$bundle" --steps=100000000 --cadence=1000)
wait_state "$job" 300 JOB_STATE_RUNNING || fail "job $job never RUNNING"
cli cancel "$job" >/dev/null || fail "cancel refused"
[ "$(state_of "$job")" = JOB_STATE_CANCELLED ] || fail "job not CANCELLED"
for w in 0 1; do
  wait_for "$tmp/worker-$w.log" "job $job ended CANCELLED" && break
done || fail "no worker stopped $job"

# 4. kill -9 the worker of a running job: FAILED naming it within 2T.
job=$(cli submit "$bundle" --steps=100000000 --cadence=1000)
wait_state "$job" 300 JOB_STATE_RUNNING || fail "job $job never RUNNING"
victim=$(cli --output=textproto get "$job" | sed -n 's/.*key: "\(worker-[01]\)".*/\1/p' | head -1)
# Every process of the worker (bash may wrap a background command in a subshell of the same
# command line), found by its unique state dir.
pgrep -f -- "--state_dir=$tmp/$victim\$" >/dev/null || fail "cannot find the process of $victim"
killed_at=$(date +%s%N)
pkill -9 -f -- "--state_dir=$tmp/$victim\$"
wait_state "$job" 100 JOB_STATE_FAILED || true
elapsed_ms=$(( ($(date +%s%N) - killed_at) / 1000000 ))
cli --output=textproto get "$job" >"$tmp/job4.txt"
grep -q JOB_STATE_FAILED "$tmp/job4.txt" || fail "job not FAILED after its worker died"
grep -q "failed_host: \"$victim\"" "$tmp/job4.txt" || fail "failure does not name $victim"
grep -q "is DEAD" "$tmp/job4.txt" || fail "failure does not say the worker is dead"
[ "$elapsed_ms" -le $((2 * timeout_s * 1000)) ] || fail "failed after ${elapsed_ms}ms, over 2T"
echo "job failed ${elapsed_ms}ms after its worker was killed (T=${timeout_s}s)"

# 5. Restart the coordinator; the surviving worker re-registers with what it holds.
survivor=worker-0; [ "$victim" = worker-0 ] && survivor=worker-1
kill -TERM "$coordinator"; wait "$coordinator" || fail "coordinator did not drain cleanly"
"$bin/meshrun-coordinator" --listen="127.0.0.1:$port" --state_dir="$tmp/coordinator" \
  --heartbeat_timeout=${timeout_s}s >"$tmp/coordinator-2.log" 2>&1 &
coordinator=$!; pids+=("$coordinator")
wait_for "$tmp/coordinator-2.log" "listening on port" || fail "coordinator did not restart"
cli workers --expect=1 --wait=30s >/dev/null || fail "survivor did not re-register"
cli submit "$bundle" --steps=20 --cadence=10 --follow --output=textproto --wait=120s >"$tmp/job5.txt" \
  || fail "job after restart did not succeed: $(cat "$tmp/job5.txt")"
grep -q "cache_hit: true" "$tmp/job5.txt" || fail "no cache hit after restart"
if [ "$survivor" = "$host1" ]; then
  grep -q "executable_bytes_sent" "$tmp/job5.txt" && fail "bytes sent to a worker that held them"
fi
echo "job_lifecycle_test: all checks passed"
