#!/usr/bin/env bash
# The main job across network namespaces (docs/netns_cluster.md): a coordinator, two workers
# of 4 CPU devices and the CLI, each in its own namespace with its own address on a private
# bridge (10.213.0.0/24, tests/netns/netns_lib.sh). Workers advertise those addresses; gloo's
# all-reduce runs between them over the bridge. The two workers are two slices of one host
# each (multislice, docs/deploy.md): data-parallel across the slices.
#   1. transformer_lm/dp4x2 on token shards of real text, a few steps, across the namespaces
#      and the slices: the plan records both slices and each host's MEGASCALE_* settings, the
#      workers exported the same into their environment; 3 replicas over 2 slices are refused;
#   2. the coordinator cut off from every worker for 1 s mid-job: the workers keep stepping and
#      buffer telemetry; after the heal every step's summary is there exactly once;
#   3. host-b's link cut mid-job: within 2 heartbeat timeouts the job FAILS naming host-b;
#      after the heal host-b's old incarnation is fenced (its job stopped, its late telemetry
#      refused: the job's history holds each step at most once) and it registers again as a
#      fresh incarnation.
# After 1, the Python SDK (meshrun.Client, in node cli) reads the job and the workers.
# Usage: netns_cluster_test.sh <directory of the binaries> <source directory>
# Exits 77 (skipped) without root / namespaces, the fortunes text or the project's Python.
set -euo pipefail
source "$(dirname "$0")/netns_lib.sh"
netns_begin "$@"
heartbeat_timeout=4
# The hang timeout bounds gloo's all-reduce (2 x 8 s): a fenced worker blocked in it stops soon.
netns_slices=2
netns_cluster --heartbeat_timeout=${heartbeat_timeout}s --hang_timeout=8s
for a in 10.213.0.11 10.213.0.12; do
  grep -q "$a:" "$tmp/workers.txt" || fail "no worker advertises $a: $(cat "$tmp/workers.txt")"
done
# The range exists only inside the test's namespaces.
ip -4 addr | grep -q "10\.213\.0\." && fail "10.213.0.0/24 leaked into the root namespace"

# 1. The main job across the namespaces.
cli submit "$lm/dp4x2/job.json" --steps=5 --cadence=1 --follow --output=textproto --wait=300s \
  --data="$tmp/shards/*.tok" >"$tmp/main.txt" || fail "dp4x2 failed: $(cat "$tmp/main.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/main.txt" || fail "dp4x2: $(cat "$tmp/main.txt")"
for host in host-a host-b; do
  grep -q "replica_hosts: \"$host\"" "$tmp/main.txt" || fail "$host is not a replica host"
done
# Multislice: host-a is slice 0 (and the megascale coordinator), host-b slice 1.
grep -q "num_slices: 2" "$tmp/main.txt" || fail "the plan has no 2 slices: $(cat "$tmp/main.txt")"
for want in 'key: "host-b"' 'value: 1' 'variables: "MEGASCALE_COORDINATOR_ADDRESS=10.213.0.11"' \
            'variables: "MEGASCALE_SLICE_ID=1"' 'variables: "MEGASCALE_NUM_SLICES=2"' \
            'variables: "MEGASCALE_PORT=8080"'; do
  grep -qF "$want" "$tmp/main.txt" || fail "the plan lacks $want: $(grep -A30 "^mesh" "$tmp/main.txt")"
done
for host in host-a:0 host-b:1; do
  grep -q "multislice: slice ${host#*:} of 2; the runtime gets MEGASCALE_COORDINATOR_ADDRESS=10.213.0.11 MEGASCALE_NUM_SLICES=2 MEGASCALE_PORT=8080 MEGASCALE_SLICE_ID=${host#*:}" \
    "$tmp/${host%:*}.log" || fail "${host%:*} did not export its MEGASCALE_* settings"
done
cli submit "$lm/dp4x2/job.json" --host_replicas=3 --steps=2 --follow --output=textproto --wait=60s \
  --data="$tmp/shards/*.tok" >"$tmp/three.txt" 2>&1 && fail "3 replicas over 2 slices succeeded"
grep -q "mesh.host_replicas is 3 but the hosts form 2 slices" "$tmp/three.txt" \
  || fail "3 replicas over 2 slices: unclear refusal: $(cat "$tmp/three.txt")"
echo "1. dp4x2 across namespaces and 2 slices: SUCCEEDED; $(grep -m1 "ASSIGNED" "$tmp/coordinator.log" | sed 's/.*ASSIGNED: //')"
# The Python SDK reaches the coordinator over the bridge too (from node cli): the job and the
# fleet as the CLI saw them.
bash "$src/scripts/install_sdk.sh" >"$tmp/install_sdk.log" 2>&1 \
  || fail "installing the SDK into .venv: $(cat "$tmp/install_sdk.log")"
main_job=$(head -1 "$tmp/main.txt")
netns_run cli "$src/.venv/bin/python" - "10.213.0.10:$port" "$main_job" >"$tmp/sdk.txt" 2>&1 <<'EOF' \
  || fail "the SDK over the bridge: $(cat "$tmp/sdk.txt")"
import sys
import meshrun
from meshrun.v1 import coordinator_pb2, job_pb2
address, job_id = sys.argv[1:3]
with meshrun.Client(address, timeout=10) as client:
    job = client.get(job_id)
    assert job_pb2.JobState.Name(job.state) == "JOB_STATE_SUCCEEDED", job
    assert list(job.mesh.replica_hosts) == ["host-a", "host-b"], job.mesh.replica_hosts
    assert job.mesh.num_slices == 2 and dict(job.mesh.host_slices) == {"host-a": 0, "host-b": 1}, job.mesh
    assert job_id in [j.job_id for j in client.list()]
    workers = {w.registration.host: w for w in client.workers()}
    assert sorted(workers) == ["host-a", "host-b"], sorted(workers)
    for host, address, index in (("host-a", "10.213.0.11", 0), ("host-b", "10.213.0.12", 1)):
        w = workers[host]
        assert coordinator_pb2.WorkerState.Name(w.state) == "WORKER_STATE_ALIVE", w
        assert w.registration.address.startswith(address + ":"), w.registration.address
        assert w.registration.slice_id == index and w.registration.num_slices == 2, w.registration
        assert len(w.registration.devices) == 4, w.registration.devices
print(f"sdk over the bridge: {job_id} SUCCEEDED on {', '.join(job.mesh.replica_hosts)}; "
      f"workers {', '.join(f'{h}@{w.registration.address}' for h, w in sorted(workers.items()))}")
EOF
echo "   $(cat "$tmp/sdk.txt")"

# 2. The coordinator cut off from all workers for 1 s (less than the heartbeat timeout).
steps=40
job=$(cli submit "$lm/dp4x2/job.json" --steps=$steps --cadence=1 --data="$tmp/shards/*.tok")
cli watch "$job" --since_step=1 >"$tmp/watch2.txt" 2>&1 &
pids+=($!)
wait_for "$tmp/watch2.txt" "^ *5 " || fail "job 2 did not reach step 5"
netns_link coord down
sleep 1
netns_link coord up
await_job "$job" "state: JOB_STATE_SUCCEEDED\|state: JOB_STATE_FAILED" 1500 0.2 || true
cli --output=textproto get "$job" >"$tmp/cut.txt"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/cut.txt" || fail "job 2 after the coordinator cut: $(cat "$tmp/cut.txt")"
cli export "$job" --format=csv --series=loss --out="$tmp/cut.csv" 2>/dev/null \
  || fail "job 2: export failed"
awk -F, -v steps=$steps 'FNR > 1 { n[$1]++ } END {
  for (s = 1; s <= steps; s++) if (n[s] != 1) { printf "step %d: %d rows\n", s, n[s]; bad = 1 }
  exit bad }' "$tmp/cut.csv" || fail "job 2: a step's summary missing or doubled: $(cat "$tmp/cut.csv")"
echo "2. coordinator cut off for 1 s: all $steps steps' summaries present exactly once"

# 3. host-b cut off mid-job.
incarnations() { sed -n 's/.*registered with coordinator .* as incarnation \([^ ]*\).*/\1/p' "$tmp/host-b.log"; }
old_incarnation=$(incarnations | tail -1)
job=$(cli submit "$lm/dp4x2/job.json" --steps=1000000 --cadence=1 --data="$tmp/shards/*.tok")
cli watch "$job" --since_step=1 >"$tmp/watch3.txt" 2>&1 &
pids+=($!)
wait_for "$tmp/watch3.txt" "^ *5 " || fail "job 3 did not reach step 5"
netns_link host-b down
cut_at=$(date +%s.%N)
await_job "$job" "state: JOB_STATE_FAILED" 200 || true
failed_at=$(date +%s.%N)
cli --output=textproto get "$job" >"$tmp/partition.txt"
grep -q "state: JOB_STATE_FAILED" "$tmp/partition.txt" \
  || fail "job 3 not FAILED 20 s after host-b's link went down: $(cat "$tmp/partition.txt")"
grep -q "host-b" <(grep "failed_host\|error" "$tmp/partition.txt") \
  || fail "the failure does not name host-b: $(grep "failed_host\|error" "$tmp/partition.txt")"
elapsed=$(awk -v a="$cut_at" -v b="$failed_at" 'BEGIN { printf "%.1f", b - a }')
awk -v e="$elapsed" -v t=$heartbeat_timeout 'BEGIN { exit !(e <= 2 * t) }' \
  || fail "host-b declared dead after ${elapsed}s, more than 2 heartbeat timeouts"
echo "3. host-b partitioned: FAILED after ${elapsed}s (bound $((2 * heartbeat_timeout))s): $(grep "^error" "$tmp/partition.txt")"
netns_link host-b up
# Fenced: host-b learns it was declared dead, stops the job and registers afresh.
wait_for "$tmp/host-b.log" "declared dead by the coordinator; stopping job $job" \
  || fail "host-b was not told it was declared dead"
wait_for "$tmp/host-b.log" "job $job ended" || fail "host-b did not stop job $job after the heal"
for _ in $(seq 100); do
  cli workers >"$tmp/workers2.txt"
  grep -q "host-b.*ALIVE" "$tmp/workers2.txt" && break; sleep 0.2
done
grep -q "host-b.*ALIVE" "$tmp/workers2.txt" || fail "host-b not ALIVE after the heal: $(cat "$tmp/workers2.txt")"
new_incarnation=$(incarnations | tail -1)
[ -n "$old_incarnation" ] && [ "$new_incarnation" != "$old_incarnation" ] \
  || fail "host-b did not register a fresh incarnation ($old_incarnation -> $new_incarnation)"
echo "   healed: host-b stopped job $job, registered again as $new_incarnation (was $old_incarnation)"
# host-b's old incarnation sent summaries it had buffered while cut off; the coordinator
# refused them (fenced), so the job's exported history holds each step at most once.
cli export "$job" --format=csv --series=loss --out="$tmp/partition.csv" 2>/dev/null \
  || fail "job 3: export failed"
[ "$(wc -l <"$tmp/partition.csv")" -gt 5 ] || fail "job 3: too few rows: $(cat "$tmp/partition.csv")"
awk -F, 'FNR > 1 { if (++n[$1] > 1) { printf "step %s: %d rows\n", $1, n[$1]; bad = 1 } }
  END { exit bad }' "$tmp/partition.csv" || fail "job 3: a step's summary stored twice after the heal"
echo "   job $job's history after the heal: $(($(wc -l <"$tmp/partition.csv") - 1)) steps, none twice"
echo "netns_cluster_test: all checks passed"
