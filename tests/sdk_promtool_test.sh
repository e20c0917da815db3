#!/usr/bin/env bash
# Live /metrics through Prometheus' own checker: a coordinator (--http_listen) and a worker
# (--log_format=json) train the MLP example; `promtool check metrics` (Debian's prometheus
# package) must pass on the scraped exposition, which carries the job's telemetry, the worker's
# per-metric families with units, meshrun_build_info and the job's step-time histogram. The worker's log is JSON, one object a
# line with UTC timestamps. Exit 77 (skipped) when promtool is not installed.
# Usage: sdk_promtool_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
promtool=$(command -v promtool || true)
[ -n "$promtool" ] || { echo "SKIP: promtool absent (scripts/setup.sh installs prometheus)"; exit 77; }
source "$(dirname "$0")/cluster_lib.sh"

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  --state_dir="$tmp/coordinator" >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
http=$(sed -n 's/.*HTTP on port \([0-9]*\).*/\1/p' "$tmp/coordinator.log" | head -1)
[ -n "$http" ] || fail "no HTTP port logged"
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=worker-0 \
  --state_dir="$tmp/worker-0" --cpu_devices=1 --log_format=json >"$tmp/worker-0.log" 2>&1 &
pids+=($!)
cli workers --expect=1 --wait=30s >/dev/null || fail "worker did not register"
cli submit "$src/examples/mlp_classifier/dp1/job.json" --steps=10 --cadence=1 --follow --output=textproto \
  --wait=120s >/dev/null || fail "the job did not succeed"

curl -sf "http://127.0.0.1:$http/metrics" >"$tmp/metrics.txt" || fail "/metrics"
"$promtool" check metrics <"$tmp/metrics.txt" >"$tmp/promtool.log" 2>&1 \
  || fail "promtool check metrics: $(cat "$tmp/promtool.log")"
for want in 'meshrun_telemetry_value{job_id="job-1",series="loss",index="0"}' \
            'meshrun_worker_execute_time_seconds_total{host="worker-0"}' \
            'meshrun_worker_execute_time_samples_total{host="worker-0"}' \
            'meshrun_worker_steps_total{host="worker-0"}' \
            'meshrun_job_goodput_ratio{job_id="job-1"}' 'meshrun_build_info{version="' \
            '# TYPE meshrun_job_step_time_seconds histogram' \
            'meshrun_job_step_time_seconds_bucket{job_id="job-1",le="0.001"}' \
            'meshrun_job_step_time_seconds_sum{job_id="job-1"}'; do
  grep -qF "$want" "$tmp/metrics.txt" || fail "/metrics lacks $want"
done
# The histogram counted the job's summaries (one per step at --cadence=1): its +Inf bucket
# equals its count, at least 1.
inf=$(sed -n 's/^meshrun_job_step_time_seconds_bucket{job_id="job-1",le="+Inf"} //p' \
  "$tmp/metrics.txt")
count=$(sed -n 's/^meshrun_job_step_time_seconds_count{job_id="job-1"} //p' "$tmp/metrics.txt")
[ -n "$inf" ] && [ "$inf" = "$count" ] && [ "$count" -ge 1 ] \
  || fail "step-time histogram: +Inf bucket '$inf', count '$count'"
if grep -q '{job="' "$tmp/metrics.txt"; then fail "a job label collides with Prometheus' own"; fi

# The worker's own log lines are JSON objects with UTC timestamps (the PJRT plugin may write
# lines of its own to stderr; none of meshrun's is in the text format).
"$src/.venv/bin/python" - "$tmp/worker-0.log" <<'PY' || fail "worker log is not JSON lines"
import json, re, sys
lines = [l for l in open(sys.argv[1]) if l.strip()]
assert not [l for l in lines if re.match(r"\d{4}-\d\d-\d\dT\S+ \w meshrun-worker\]", l)], lines
objects = [l for l in lines if l.startswith("{")]
assert len(objects) >= 3, lines
for line in objects:
    entry = json.loads(line)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", entry["time"]), entry
    assert entry["program"] == "meshrun-worker" and entry["level"] and "message" in entry, entry
PY
echo "PASS: promtool check metrics on live /metrics; JSON logs"
