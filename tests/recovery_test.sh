#!/usr/bin/env bash
# Automatic recovery (docs/checkpoints.md) through the real binaries on loopback: the
# transformer LM across two host replicas (2 x 4 CPU devices, gradients averaged with gloo) on
# seeded synthetic tokens, checkpointing every 50 steps. One worker is killed with SIGKILL after
# step 70 and started again under the same host name: the coordinator stops the survivor, waits
# for two healthy hosts, restores step 50 and goes on. The job SUCCEEDS, its manifest records the
# attempt (the dead host, restored step 50, the steps run again), and its loss history holds one
# value per step equal to an uninterrupted run's within 1e-6 relative.
# Usage: recovery_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
lm="$src/examples/transformer_lm/dp4x2/job.json"
source "$(dirname "$0")/cluster_lib.sh"
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" \
  --heartbeat_timeout=2s --restart_wait=60s >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
declare -A worker_pid
start_worker() {  # host, worker index
  "$bin/meshrun-worker" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host="$1" \
    --worker_index="$2" --cpu_devices=4 --state_dir="$tmp/$1" >>"$tmp/$1.log" 2>&1 &
  pids+=($!)
  worker_pid[$1]=$!
}
start_worker host-a 0
start_worker host-b 1
cli workers --expect=2 --wait=30s >/dev/null || fail "workers did not register"
steps=120
export_loss() {  # job, csv
  cli export "$1" --format=csv --series=metrics.loss --out="$2" 2>/dev/null || fail "export $1"
}

cli submit "$lm" --data=synthetic --steps=$steps --cadence=1 --follow --wait=300s \
  >"$tmp/plain.txt" || fail "the uninterrupted run failed: $(cat "$tmp/plain.txt")"
export_loss "$(field job_id <"$tmp/plain.txt")" "$tmp/plain.csv"

job=$(cli submit "$lm" --data=synthetic --steps=$steps --cadence=1 --checkpoint_dir="$tmp" \
  --checkpoint_every=50)
cli watch "$job" --since_step=1 >"$tmp/watch.txt" 2>&1 &
pids+=($!)
wait_for "$tmp/watch.txt" "^ *70 " || fail "the job did not reach step 70"
kill -9 "${worker_pid[host-b]}"
start_worker host-b 1
for _ in $(seq 1200); do
  cli --output=textproto get "$job" | grep -q "state: JOB_STATE_\(SUCCEEDED\|FAILED\|CANCELLED\)" && break
  sleep 0.1
done
cli --output=textproto get "$job" >"$tmp/recovered.txt"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/recovered.txt" \
  || fail "the job did not recover: $(cat "$tmp/recovered.txt")"
grep -A8 "^attempts {" "$tmp/recovered.txt" >"$tmp/attempt.txt" || fail "no attempt recorded"
grep -q "host: \"host-b\"" "$tmp/attempt.txt" && grep -q "restored_step: 50" "$tmp/attempt.txt" \
  || fail "the attempt does not name host-b and step 50: $(cat "$tmp/attempt.txt")"
export_loss "$job" "$tmp/recovered.csv"
awk -F, -v rows=$steps '
  FNR == 1 { next }
  FNR == NR { a[$1] = $6; next }
  { n++; if (seen[$1]++) dup++; d = ($6 - a[$1]) / a[$1]; d = d < 0 ? -d : d; if (d > worst) worst = d }
  END { printf "recovered run: %d values, %d duplicates, worst relative difference %.2e\n",
               n, dup, worst; exit !(n == rows && dup == 0 && worst <= 1e-6) }' \
  "$tmp/plain.csv" "$tmp/recovered.csv" || fail "the recovered run differs from the uninterrupted one"
echo "recovery: $(grep -E "steps_lost|cause" "$tmp/attempt.txt" | tr -s ' ' | tr '\n' ' ')"
echo "recovery_test: all checks passed"
