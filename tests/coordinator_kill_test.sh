#!/usr/bin/env bash
# kill -9 of the coordinator mid-job, with the real binaries on loopback: a coordinator and a
# worker (8 CPU devices) run the data-parallel MLP while `meshrun watch` follows it.
#   1. the coordinator is killed (SIGKILL) while the job runs; the watch loses its stream;
#   2. it restarts on the same state directory and port; the worker keeps training, resends what
#      was not acknowledged, and the job's telemetry resumes;
#   3. a watch reconnecting with --since_step=<last seen + 1> continues with no gap and no
#      duplicate, to the end of the job (which ends the stream);
#   4. the history (export jsonl) holds every step of the job exactly once, none partial;
#   5. the job itself survived: the restarted coordinator knows it and it ends SUCCEEDED with
#      the worker's report; a job submitted now gets the next id;
#   6. a running job whose worker dies with the coordinator FAILS after the restart, naming it,
#      once the worker has had 2 heartbeat timeouts to come back.
# (Steps half reported by several hosts at the crash: coordinator_telemetry_test.)
# Usage: coordinator_kill_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/mlp_classifier/dp8/job.json"
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$bundle" ] || fail "bundle $bundle missing"

steps=${COORDINATOR_KILL_STEPS:-6000}
cadence=20
start_coordinator() {  # port, log number, flags...
  "$bin/meshrun-coordinator" --listen="127.0.0.1:$1" --state_dir="$tmp/coordinator" --data_root="$tmp" "${@:3}" \
    >"$tmp/coordinator-$2.log" 2>&1 &
  coordinator=$!; pids+=("$coordinator")
  await_coordinator "$tmp/coordinator-$2.log"
}
# Step numbers of a watch's table rows.
rows() { awk '$1 ~ /^[0-9]+$/ {print $1}' "$1"; }

start_coordinator "$(stable_port)" 1
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=worker-0 \
  --state_dir="$tmp/worker-0" >"$tmp/worker-0.log" 2>&1 &
worker=$!; pids+=("$worker")
cli workers --expect=1 --wait=30s >/dev/null || fail "the worker did not register"

job=$(cli submit "$bundle" --steps="$steps" --cadence=$cadence)
cli watch "$job" --since_step=1 >"$tmp/watch-1.txt" 2>"$tmp/watch-1.log" &
watch1=$!; pids+=("$watch1")
for _ in $(seq 600); do [ "$(rows "$tmp/watch-1.txt" | wc -l)" -ge 5 ] && break; sleep 0.1; done
[ "$(rows "$tmp/watch-1.txt" | wc -l)" -ge 5 ] || fail "the job reported no telemetry"

# 1. kill -9 mid-job.
kill -9 "$coordinator"
wait "$coordinator" 2>/dev/null || true
wait "$watch1" 2>/dev/null && fail "the watch did not notice the coordinator die"
seen=$(rows "$tmp/watch-1.txt" | tail -1)
[ "$seen" -lt "$steps" ] || fail "the job ended before the kill; raise COORDINATOR_KILL_STEPS"
echo "coordinator killed; the watch had seen through step $seen"
sleep 1  # the worker keeps training and queues its summaries

# 2. Restart on the same port and state; 3. the watch resumes where it stopped.
start_coordinator "$port" 2
wait_for "$tmp/coordinator-2.log" "telemetry of job $job resumed" || fail "telemetry not resumed"
timeout 300 "$bin/meshrun" --coordinator="127.0.0.1:$port" watch "$job" \
  --since_step=$((seen + 1)) >"$tmp/watch-2.txt" 2>"$tmp/watch-2.log" \
  || fail "the resumed watch did not end cleanly: $(cat "$tmp/watch-2.log")"

expected=$(seq $cadence $cadence "$steps")
got=$( (rows "$tmp/watch-1.txt"; rows "$tmp/watch-2.txt") )
[ "$got" = "$expected" ] || fail "watch across the restart: $(diff <(echo "$expected") <(echo "$got") | head -20)"

# 4. The history: every step once, complete (both hosts combined), nothing partial.
cli export "$job" --format=jsonl --out="$tmp/history.jsonl" 2>/dev/null || fail "export failed"
history=$(sed -n 's/^{"step":\([0-9]*\),.*/\1/p' "$tmp/history.jsonl")
[ "$history" = "$expected" ] || fail "history: $(diff <(echo "$expected") <(echo "$history") | head -20)"
partial=$(grep -c '"partial":true' "$tmp/history.jsonl" || true)
[ "$partial" -eq 0 ] || fail "$partial steps partial: $(grep '"partial":true' "$tmp/history.jsonl" | head -3)"
grep -q "$job" "$tmp/coordinator-2.log" || fail "restart log does not name $job"

# 5. The job table survived the kill too.
for _ in $(seq 100); do
  cli --output=textproto get "$job" >"$tmp/job.txt" 2>&1 || fail "the restarted coordinator lost $job: $(cat "$tmp/job.txt")"
  grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job.txt" && break
  sleep 0.1
done
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job.txt" || fail "$job after the restart: $(cat "$tmp/job.txt")"
next=$(cli submit "$bundle" --steps=1 --follow --output=textproto --wait=60s | field job_id)
[ "$next" = "job-$(( ${job#job-} + 1 ))" ] || fail "a job submitted after the restart got id $next"

# 6. The coordinator and the worker die together while a job runs; the worker stays away.
lost=$(cli submit "$bundle" --steps=1000000 --cadence=1000)
await_job "$lost" "state: JOB_STATE_RUNNING" 300 || fail "$lost did not start"
kill -9 "$coordinator" "$worker"
wait "$coordinator" "$worker" 2>/dev/null || true  # gone, its cache lock released
start_coordinator "$port" 3 --heartbeat_timeout=1s
await_job "$lost" "state: JOB_STATE_FAILED" 100 || true
cli --output=textproto get "$lost" >"$tmp/lost.txt"
grep -q "error: \"worker worker-0 (incarnation .*) did not come back after the coordinator restarted\"" \
  "$tmp/lost.txt" || fail "$lost after a restart without its worker: $(cat "$tmp/lost.txt")"
echo "coordinator_kill_test: $(echo "$expected" | wc -l) steps, watch resumed after step $seen with no gap or duplicate; all checks passed"
