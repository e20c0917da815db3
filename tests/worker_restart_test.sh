#!/usr/bin/env bash
# A worker killed (kill -9) and restarted at the same --listen address gets its next job
# (issue 16): the coordinator's channel to the dead process was backing off, and the job sent
# to the new process failed at once with "Connection refused". Twice: a job is sent to the dead
# process first each time, so the channel is in its reconnect backoff when the worker is back.
# Usage: worker_restart_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/mlp_classifier/dp1/job.json"
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$bundle" ] || fail "bundle $bundle missing"

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" \
  --heartbeat_timeout=3s >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"

start_worker() {  # $1: log name, $2: listen address
  "$bin/meshrun-worker" "$(worker_data_root)" --listen="$2" --coordinator="127.0.0.1:$port" --host=worker-0 \
    --worker_index=0 --cpu_devices=1 --state_dir="$tmp/worker" >"$tmp/$1.log" 2>&1 &
  worker=$!; pids+=("$worker")
  wait_for "$tmp/$1.log" "registered with coordinator" || fail "$1 did not register"
}
start_worker worker-1 "127.0.0.1:$(stable_port)"  # restarted at the same address below
wport=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$tmp/worker-1.log" | head -1)

# A first job opens the coordinator's channel to the worker.
cli submit "$bundle" --steps=5 --cadence=5 --follow --output=textproto --wait=120s >"$tmp/job1.txt" \
  || fail "job 1 did not succeed: $(cat "$tmp/job1.txt")"

for round in 2 3; do
  kill -9 "$worker"; wait "$worker" 2>/dev/null || true
  # Still ALIVE in the registry: a job sent now finds nobody at the address, and the
  # coordinator's channel to it starts backing off.
  dead=$(cli submit "$bundle" --steps=5 --cadence=5)
  await_job "$dead" "state: JOB_STATE_FAILED" 100 || fail "job $dead to a dead worker did not fail"
  start_worker "worker-$round" "127.0.0.1:$wport"
  cli submit "$bundle" --steps=5 --cadence=5 --follow --output=textproto --wait=120s >"$tmp/job$round.txt" \
    || fail "job $round, after the restart at 127.0.0.1:$wport, did not succeed: $(cat "$tmp/job$round.txt")"
  grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job$round.txt" || fail "job $round state"
  # The failed job's StartJob, if it waited for the address, is refused by the new process.
  ! grep -q "job $dead started" "$tmp/worker-$round.log" || fail "the restarted worker ran $dead, a job of its dead incarnation"
done
echo "worker_restart_test: both jobs after a restart at the same address succeeded"
