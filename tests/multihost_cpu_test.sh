#!/usr/bin/env bash
# A multi-host CPU job through the real binaries on loopback (docs/multihost_cpu.md): a
# coordinator, one worker with 8 CPU devices and two with 4, all with XLA's CPU PJRT plugin.
#   1. refusals: host replicas for a mode A job (at submit, naming mesh.host_replicas), and more
#      replicas than there are fitting hosts (the job FAILS naming the hosts passed over);
#   2. transformer_lm/dp8 on token shards of real text, 50 steps, lands on the 8-device host;
#   3. transformer_lm/dp4x2 on the same shards: the coordinator compiles each program once,
#      both 4-device hosts run it on their halves of the global batch, and they average their
#      gradients with gloo each step; the loss curve equals 1 x 8's within 1e-4 relative;
#   4. transformer_moe/dp4x2 (2 micro-steps per step) on its bundle's batches matches JAX's
#      two-host reference within 1e-4;
#   5. a replica host killed mid-job: the job FAILS naming it, and nothing hangs.
# Usage: multihost_cpu_test.sh <directory of the binaries> <source directory>
# Exits 77 (skipped) when the fortunes text or the project's Python is absent.
set -euo pipefail
bin=$1
src=$2
lm="$src/examples/transformer_lm"
moe="$src/examples/transformer_moe"
source "$(dirname "$0")/cluster_lib.sh"
fortune_shards
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" --data_root="$tmp" \
  --heartbeat_timeout=3s >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
declare -A worker_pid
start_worker() {  # host, worker index, CPU devices
  "$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host="$1" \
    --worker_index="$2" --cpu_devices="$3" --state_dir="$tmp/$1" >"$tmp/$1.log" 2>&1 &
  pids+=($!)
  worker_pid[$1]=$!
}
start_worker host-a 0 4
start_worker host-b 1 4
start_worker host-8 2 8
cli workers --expect=3 --wait=30s >/dev/null || fail "workers did not register"

# 1. Refusals.
if cli submit "$lm/dp8/job.json" --host_replicas=2 \
    >"$tmp/bad1.txt" 2>&1; then
  fail "host replicas of a mode A job accepted"
fi
grep -q "mesh.host_replicas.*compile mode B" "$tmp/bad1.txt" \
  || fail "mode A refusal unclear: $(cat "$tmp/bad1.txt")"
cli submit "$moe/dp4x2/job.json" --host_replicas=3 --steps=2 --follow --output=textproto --wait=60s \
  >"$tmp/bad2.txt" 2>&1 && fail "3 replicas on 2 fitting hosts succeeded"
grep -q "state: JOB_STATE_FAILED" "$tmp/bad2.txt" || fail "3 replicas: $(cat "$tmp/bad2.txt")"
grep -q "needs 3 CPU hosts.*2 found.*host-8:" "$tmp/bad2.txt" \
  || fail "3 replicas: the error does not say why: $(cat "$tmp/bad2.txt")"

# 2 and 3. One host x 8 devices, then two hosts x 4, on the same real text.
run() {  # bundle, output name, extra flags...
  local bundle=$1 name=$2
  shift 2
  cli submit "$bundle" --steps=50 --cadence=1 --follow --output=textproto --wait=600s "$@" >"$tmp/$name.txt" \
    || fail "$name did not succeed: $(cat "$tmp/$name.txt")"
  grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/$name.txt" || fail "$name: $(cat "$tmp/$name.txt")"
  local job
  job=$(field job_id <"$tmp/$name.txt")
  cli export "$job" --format=csv --series=loss --out="$tmp/$name.csv" 2>/dev/null \
    || fail "$name: export failed"
}
run "$lm/dp8/job.json" one_by_8 --data="$tmp/shards/*.tok"
grep -q 'device_hosts: "host-8"' "$tmp/one_by_8.txt" || fail "dp8 did not run on host-8"
run "$lm/dp4x2/job.json" two_by_4 --data="$tmp/shards/*.tok"
for host in host-a host-b; do
  grep -q "replica_hosts: \"$host\"" "$tmp/two_by_4.txt" || fail "$host is not a replica host"
done
grep -q "host-8" "$tmp/two_by_4.txt" && fail "dp4x2 ran on host-8"
grep -q "compiled_on: \"coordinator\"\|compiled_on: \"host-a\"" "$tmp/two_by_4.txt" \
  || fail "dp4x2 was not compiled once: $(grep compiled_on "$tmp/two_by_4.txt")"
# Both hosts averaged gradients once per step.
cli metrics >"$tmp/metrics.txt"
for host in host-a host-b; do
  sed -n "/^== $host\$/,/^== /p" "$tmp/metrics.txt" | grep -A1 "Metric: AllReduceTime" \
    | grep -q "TotalSamples: 50$" || fail "$host did not all-reduce 50 times: $(cat "$tmp/metrics.txt")"
done

# Loss per step: 2 x 4 equals 1 x 8 within 1e-4 relative.
compare() {  # csv a, csv b, expected rows, label
  awk -F, -v rows="$3" -v label="$4" '
    FNR == 1 { next }
    FNR == NR { a[$1] = $6; next }
    ($1 in a) { n++; d = ($6 - a[$1]) / a[$1]; d = d < 0 ? -d : d; if (d > worst) worst = d;
                if (!first) first = $6; last = $6 }
    END { printf "%s: %d steps, loss %.4f -> %.4f, worst relative difference %.2e\n",
                 label, n, first, last, worst;
          exit !(n == rows && worst <= 1e-4) }' "$1" "$2"
}
compare "$tmp/one_by_8.csv" "$tmp/two_by_4.csv" 50 "2x4 vs 1x8 on real text" \
  || fail "2 x 4 does not reproduce 1 x 8"

# 4. The bundle's batches against JAX's simulation of the two hosts.
cli submit "$moe/dp4x2/job.json" --steps=20 --cadence=1 --follow --output=textproto --wait=600s >"$tmp/bundle.txt" \
  || fail "dp4x2 on the bundle's data did not succeed: $(cat "$tmp/bundle.txt")"
job=$(field job_id <"$tmp/bundle.txt")
cli export "$job" --format=csv --series=loss --out="$tmp/bundle.csv" 2>/dev/null \
  || fail "bundle export failed"
"$python" - "$moe/dp4x2/reference.json" >"$tmp/reference.csv" <<'EOF'
import json, sys
print("step,wall_time_unix_micros,series,element,index,value,partial")
for step, loss in enumerate(json.load(open(sys.argv[1]))["loss"], 1):
    print(f"{step},0,loss,0,,{loss!r},false")
EOF
compare "$tmp/reference.csv" "$tmp/bundle.csv" 20 "dp4x2 vs JAX's two-host reference" \
  || fail "dp4x2 does not match JAX"

# 5. host-b dies mid-job: host-a's all-reduce loses its peer, the coordinator its heartbeats.
job=$(cli submit "$lm/dp4x2/job.json" --steps=1000000 --cadence=10 --data="$tmp/shards/*.tok")
cli watch "$job" --since_step=1 >"$tmp/watch.txt" 2>&1 &
pids+=($!)
wait_for "$tmp/watch.txt" "^ *20 " || fail "the long job did not reach step 20"
kill -9 "${worker_pid[host-b]}"
await_job "$job" "state: JOB_STATE_FAILED" 150 || true
cli --output=textproto get "$job" >"$tmp/killed.txt"
grep -q "state: JOB_STATE_FAILED" "$tmp/killed.txt" || fail "not FAILED 15 s after host-b died"
grep -q "host-b" <(grep "failed_host\|error" "$tmp/killed.txt") \
  || fail "the failure does not name host-b: $(grep "failed_host\|error" "$tmp/killed.txt")"
echo "host-b killed: $(grep "^error" "$tmp/killed.txt")"
echo "multihost_cpu_test: all checks passed"
