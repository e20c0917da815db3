#!/usr/bin/env bash
# Liveness by progress across network namespaces (docs/liveness.md): a coordinator with
# --hang_timeout=8s and a heartbeat timeout (60s) far longer, two workers of 4 CPU devices
# running transformer_lm/dp4x2.
#   1. Straggler: host-b is throttled (SIGSTOP/SIGCONT pulses, ~6/7 of its time stopped): the
#      straggler detector flags it, in `meshrun get` (the `stragglers:` line; straggler_hosts
#      in textproto) and in /metrics
#      (meshrun_host_straggler{job_id,host}), and on the dashboard (headless Chromium in the
#      CLI's namespace: the job header, its row and host-b's worker row); host-a is never flagged.
#   2. Hang: host-b is SIGSTOPped mid-job: it neither steps nor heartbeats,
# and host-a waits for it in the gradient all-reduce. The job FAILS within the hang timeout
# plus two report intervals, with failed_host host-b and an error saying host-b made no
# progress and host-a waits in the gradient all-reduce (before gloo's own timeout, 2 x 8s).
# Usage: netns_hang_test.sh <directory of the binaries> <source directory>
# Exits 77 (skipped) without root / namespaces, the fortunes text or the project's Python.
set -euo pipefail
source "$(dirname "$0")/netns_lib.sh"
netns_begin "$@"
hang_timeout=8
netns_cluster --heartbeat_timeout=60s --hang_timeout=${hang_timeout}s --http_listen=10.213.0.10:0

job=$(cli submit "$lm/dp4x2/job.json" --steps=1000000 --cadence=1 --data="$tmp/shards/*.tok")
cli watch "$job" --since_step=1 >"$tmp/watch.txt" 2>&1 &
pids+=($!)
# Up to 60 s: compiling the two programs takes ~40 s on a loaded 2-core machine.
wait_for "$tmp/watch.txt" "^ *5 " || wait_for "$tmp/watch.txt" "^ *5 " || fail "the job did not reach step 5"

# 1. Straggler.
( while true; do kill -STOP "${worker_pid[host-b]}"; sleep 0.3; kill -CONT "${worker_pid[host-b]}"; sleep 0.05; done ) &
pulser=$!
pids+=($pulser)
http_port=$(sed -n 's/.*HTTP on port \([0-9]*\).*/\1/p' "$tmp/coordinator.log" | head -1)
flagged() {  # in `meshrun get` (textproto and text) and in /metrics, while the throttling goes on
  cli --output=textproto get "$job" >"$tmp/get.txt" && grep -q 'straggler_hosts: "host-b"' "$tmp/get.txt" &&
    cli get "$job" >"$tmp/get_text.txt" && grep -Eq '^stragglers: +host-b$' "$tmp/get_text.txt" &&
    netns_run cli curl -fsS "http://10.213.0.10:$http_port/metrics" >"$tmp/metrics.txt" &&
    grep "^meshrun_host_straggler{" "$tmp/metrics.txt" | grep "job_id=\"$job\"" \
      | grep -q "host=\"host-b\"} 1$"
}
seen=0
for _ in $(seq 100); do if flagged; then seen=1; break; fi; sleep 0.2; done
[ $seen = 1 ] || fail "host-b not flagged: $(grep straggler "$tmp/get.txt" "$tmp/get_text.txt" "$tmp/metrics.txt")"
grep -q 'straggler_hosts: "host-a"' "$tmp/get.txt" && fail "host-a flagged"
[ -d "$src/web/node_modules/playwright-core" ] || fail "playwright-core missing (run scripts/setup.sh)"
netns_run cli node "$src/tests/netns/dashboard_straggler.mjs" "$src/web" \
  "http://10.213.0.10:$http_port/" "$job" host-b "$bin/netns_dashboard_straggler.png" \
  || fail "the dashboard does not show host-b as a straggler"
kill "$pulser"; wait "$pulser" 2>/dev/null || true
kill -CONT "${worker_pid[host-b]}"
echo "1. host-b throttled: flagged as a straggler ($(grep "stragglers at" "$tmp/coordinator.log" | head -1))"
sleep 2  # host-b catches up with host-a; the job steps normally again

# 2. Hang.
kill -STOP "${worker_pid[host-b]}"
stopped_at=$(date +%s.%N)
await_job "$job" "state: JOB_STATE_FAILED" 300 || true
failed_at=$(date +%s.%N)
cli --output=textproto get "$job" >"$tmp/hang.txt"
grep -q "state: JOB_STATE_FAILED" "$tmp/hang.txt" || fail "not FAILED 30 s after host-b stopped"
error=$(grep "^error" "$tmp/hang.txt")
grep -q 'failed_host: "host-b"' "$tmp/hang.txt" || fail "failed_host is not host-b: $error"
grep -q "host-b made no progress since step [0-9]" <<<"$error" || fail "unclear: $error"
grep -q "host-a waits in the gradient all-reduce" <<<"$error" || fail "host-a's wait unnamed: $error"
elapsed=$(awk -v a="$stopped_at" -v b="$failed_at" 'BEGIN { printf "%.1f", b - a }')
# Bound: the hang timeout, one report interval (timeout / 4) and one sweep (timeout / 4).
awk -v e="$elapsed" -v t=$hang_timeout 'BEGIN { exit !(e <= 1.5 * t + 1) }' \
  || fail "hang detected after ${elapsed}s (hang timeout ${hang_timeout}s)"
echo "2. host-b stopped: FAILED after ${elapsed}s (--hang_timeout=${hang_timeout}s): $error"
kill -CONT "${worker_pid[host-b]}"
echo "netns_hang_test: all checks passed"
