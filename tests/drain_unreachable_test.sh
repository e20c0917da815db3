#!/usr/bin/env bash
# A worker's drain ends within --drain_timeout even when the coordinator is unreachable
# (issue 16): the coordinator is paused (SIGSTOP, so calls hang rather than fail) while the
# worker runs a job, then the worker gets SIGTERM. Its outcome report, telemetry flush and
# deregistration all give up at the drain deadline; only a heartbeat already in flight may
# overrun it, by at most the worker's 5 s RPC timeout.
# Usage: drain_unreachable_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/mlp_classifier/dp1/job.json"
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$bundle" ] || fail "bundle $bundle missing"

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" \
  >"$tmp/coordinator.log" 2>&1 &
coordinator=$!; pids+=("$coordinator")
await_coordinator "$tmp/coordinator.log"
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=worker-0 \
  --cpu_devices=1 --state_dir="$tmp/worker" --drain_timeout=3s >"$tmp/worker.log" 2>&1 &
worker=$!; pids+=("$worker")
cli workers --expect=1 --wait=30s >/dev/null || fail "worker did not register"
job=$(cli submit "$bundle" --steps=100000000 --cadence=100)
wait_for "$tmp/worker.log" "job $job started" || fail "job $job did not start"

kill -STOP "$coordinator"
started=$(date +%s%N)
kill -TERM "$worker"
for _ in $(seq 200); do kill -0 "$worker" 2>/dev/null || break; sleep 0.1; done
elapsed_ms=$(( ($(date +%s%N) - started) / 1000000 ))
kill -CONT "$coordinator"
kill -0 "$worker" 2>/dev/null && fail "worker still draining after ${elapsed_ms} ms"
echo "drain with the coordinator unreachable took ${elapsed_ms} ms (--drain_timeout=3s)"
[ "$elapsed_ms" -le 9000 ] || fail "drain took ${elapsed_ms} ms: over 3 s + the 5 s RPC timeout"
echo "drain_unreachable_test: passed"
