#!/usr/bin/env bash
# The coordinator's HTTP port with a real job on loopback: a coordinator (--http_listen on
# port 0) and one worker (8 CPU devices, XLA's CPU PJRT plugin) train the transformer LM.
#   1. headless Chromium (playwright-core) opens the dashboard before the job is submitted,
#      sees the jobs table show it and the loss chart gain points while it runs, and saves a
#      screenshot to <build>/dashboard_e2e.png;
#   2. /metrics then carries the job's latest telemetry and the worker's metrics;
#   3. bad requests get 404/400 naming the problem, and the server keeps serving.
# Usage: dashboard_e2e_test.sh <directory of the binaries> <source directory> <build directory>
set -euo pipefail
bin=$1
src=$2
build=$3
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$build/web/index.html" ] || fail "no dashboard assets in $build/web (run scripts/setup.sh, then build)"
[ -d "$src/web/node_modules/playwright-core" ] || fail "playwright-core missing (run scripts/setup.sh)"

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  --state_dir="$tmp/coordinator" >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
http=$(sed -n 's/.*HTTP on port \([0-9]*\).*/\1/p' "$tmp/coordinator.log" | head -1)
[ -n "$http" ] || fail "no HTTP port logged"
base="http://127.0.0.1:$http"
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=worker-0 \
  --state_dir="$tmp/worker-0" --cpu_devices=8 >"$tmp/worker-0.log" 2>&1 &
pids+=($!)
"$bin/meshrun" --coordinator="127.0.0.1:$port" workers --expect=1 --wait=30s >/dev/null \
  || fail "worker did not register"

# 1. The browser, with the job submitted once the page is open.
node "$src/tests/dashboard_e2e.mjs" "$src/web" "$base/" "$build/dashboard_e2e.png" -- \
  "$bin/meshrun" --coordinator="127.0.0.1:$port" submit \
  "$src/examples/transformer_lm/dp8/job.json" --steps=120 --cadence=2 \
  || fail "browser test"
[ -s "$build/dashboard_e2e.png" ] || fail "no screenshot"

for _ in $(seq 3000); do
  "$bin/meshrun" --coordinator="127.0.0.1:$port" --output=textproto get job-1 | grep "state: JOB_STATE_SUCCEEDED" >/dev/null && break
  sleep 0.1
done
"$bin/meshrun" --coordinator="127.0.0.1:$port" --output=textproto get job-1 | grep "state: JOB_STATE_SUCCEEDED" >/dev/null \
  || fail "job-1 did not succeed"

# 2. Prometheus text with the job's telemetry and the worker's metrics.
curl -sf "$base/metrics" >"$tmp/metrics.txt" || fail "/metrics"
for want in 'meshrun_telemetry_value{job_id="job-1",series="loss",index="0"}' \
            'meshrun_telemetry_value{job_id="job-1",series="sink_mass",index="23"}' \
            'meshrun_worker_up{host="worker-0"} 1' \
            'meshrun_worker_execute_time_seconds_total{host="worker-0"}' \
            'meshrun_job_state{job_id="job-1",state="' 'meshrun_build_info{version="0.1.0"} 1'; do
  grep -qF "$want" "$tmp/metrics.txt" || fail "/metrics lacks $want: $(cat "$tmp/metrics.txt")"
done

# 3. Bad requests, then the server still serves.
code() { curl -s -o "$tmp/body" -w '%{http_code}' "$base$1"; }
[ "$(code /no/such/page)" = 404 ] || fail "unknown path: $(cat "$tmp/body")"
[ "$(code '/api/watch?job=job-1&since_step=-3')" = 400 ] || fail "bad since_step"
grep -q since_step "$tmp/body" || fail "400 does not name since_step: $(cat "$tmp/body")"
[ "$(code '/api/watch?job=job-1&since_step=99999')" = 400 ] || fail "since_step beyond latest"
[ "$(code /api/job)" = 400 ] && grep -q '\\"id\\"' "$tmp/body" || fail "missing id: $(cat "$tmp/body")"
[ "$(code /metrics)" = 200 ] || fail "/metrics after bad requests"
[ "$(code /)" = 200 ] || fail "/ after bad requests"
# The event stream replays the finished job's history from a step, then ends.
curl -sf --max-time 20 "$base/api/watch?job=job-1&since_step=100" >"$tmp/events.txt" \
  || fail "watch stream"
[ "$(grep -c '^event: summary' "$tmp/events.txt")" = 11 ] || fail "events: $(head -c 600 "$tmp/events.txt")"
grep -q '^id: 100$' "$tmp/events.txt" && grep -q '^event: end' "$tmp/events.txt" \
  || fail "event ids or end: $(tail -c 600 "$tmp/events.txt")"
echo "PASS: dashboard end to end (screenshot $build/dashboard_e2e.png)"
