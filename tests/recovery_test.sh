#!/usr/bin/env bash
# Automatic recovery (docs/checkpoints.md) through the real binaries on loopback: the
# transformer LM across two host replicas (2 x 4 CPU devices, gradients averaged with gloo) on
# seeded synthetic tokens, checkpointing every 30 steps (no in-memory tier). After step 70 one
# chunk of the newest checkpoint (step 60) is truncated, and one worker is killed with SIGKILL
# and started again under the same host name: the coordinator stops the survivor, waits for two
# healthy hosts and restores step 60; the hosts find the truncated chunk, so it falls back to
# step 30 and goes on.
# The job SUCCEEDS, its manifest records both attempts (the dead host and restored step 60; the
# failed restore and step 30) and marks step 60 unrestorable, and its loss history holds one
# value per step equal to an uninterrupted run's within 1e-6 relative (the re-run steps replace
# the lost runs'); `meshrun watch` shows one line per restart and goes on, and so does the
# dashboard, open in headless Chromium through both restarts (dashboard_rewind.mjs); the
# goodput partitions its wall time (rerun steps, each run's failure tail, the restore). Then a preemption of another run of the job:
# `meshrun checkpoint` commits a step both hosts save, and SIGTERM to one host makes both save
# the step the coordinator picks and stop, so the restart loses 0 steps and the job SUCCEEDS with
# the uninterrupted run's losses. Last, the memory tier: a host killed with a spare registered,
# the job restored from the hosts' in-memory checkpoints onto the survivor and the spare; then
# both hosts of a run lost at once, the job restored from disk.
# Usage: recovery_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
lm="$src/examples/transformer_lm/dp4x2/job.json"
source "$(dirname "$0")/cluster_lib.sh"
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  --state_dir="$tmp/coordinator" --data_root="$tmp" \
  --heartbeat_timeout=2s --restart_wait=60s >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
http=$(sed -n 's/.*HTTP on port \([0-9]*\).*/\1/p' "$tmp/coordinator.log" | head -1)
[ -n "$http" ] || fail "no HTTP port logged"
declare -A worker_pid
start_worker() {  # host, worker index, flags...
  "$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host="$1" \
    --worker_index="$2" --cpu_devices=4 --state_dir="$tmp/$1" "${@:3}" >>"$tmp/$1.log" 2>&1 &
  pids+=($!)
  worker_pid[$1]=$!
}
start_worker host-a 0
start_worker host-b 1
cli workers --expect=2 --wait=30s >/dev/null || fail "workers did not register"
# Each offers its available memory for in-memory checkpoints (checked when a job is placed).
cli workers --output=json | grep -q '"host_memory_bytes": *"[1-9]' \
  || fail "no host memory registered: $(cli workers --output=json)"
steps=120
export_loss() {  # job, csv
  cli export "$1" --format=csv --series=loss --out="$2" 2>/dev/null || fail "export $1"
}
# Whether $tmp/<name>.csv holds one loss per step, each equal to $tmp/plain.csv's within 1e-6.
same_losses() {
  awk -F, -v rows=$steps -v name="$1" '
    FNR == 1 { next }
    FNR == NR { a[$1] = $6; next }
    { n++; if (seen[$1]++) dup++; d = ($6 - a[$1]) / a[$1]; d = d < 0 ? -d : d; if (d > worst) worst = d }
    END { printf "%s run: %d values, %d duplicates, worst relative difference %.2e\n",
                 name, n, dup, worst; exit !(n == rows && dup == 0 && worst <= 1e-6) }' \
    "$tmp/plain.csv" "$tmp/$1.csv"
}

cli submit "$lm" --data=synthetic --steps=$steps --cadence=1 --follow --output=textproto --wait=300s \
  >"$tmp/plain.txt" || fail "the uninterrupted run failed: $(cat "$tmp/plain.txt")"
export_loss "$(field job_id <"$tmp/plain.txt")" "$tmp/plain.csv"

job=$(cli submit "$lm" --data=synthetic --steps=$steps --cadence=1 --checkpoint_dir="$tmp" \
  --checkpoint_every=30 --memory_checkpoint_every=0)
cli watch "$job" --since_step=1 >"$tmp/watch.txt" 2>&1 &
pids+=($!)
node "$src/tests/dashboard_rewind.mjs" "$src/web" "http://127.0.0.1:$http/" "$job" $steps \
  "$bin/../recovery_dashboard.png" >"$tmp/dashboard.log" 2>&1 &
dashboard=$!
pids+=($dashboard)
wait_for "$tmp/watch.txt" "^ *70 " || fail "the job did not reach step 70"
[ -f "$tmp/60/meshrun_checkpoint.json" ] || fail "step 60 is not committed at step 70"
chunk=$(find "$tmp/60" -mindepth 2 -name '0*' -type f | sort | head -1)
truncate -s -4 "$chunk"
kill -9 "${worker_pid[host-b]}"
start_worker host-b 1
await_job "$job" "state: JOB_STATE_\(SUCCEEDED\|FAILED\|CANCELLED\)" 1200 || true
cli --output=textproto get "$job" >"$tmp/recovered.txt"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/recovered.txt" \
  || fail "the job did not recover: $(cat "$tmp/recovered.txt")"
cli get "$job" --output=json >"$tmp/recovered.json"
"$src/.venv/bin/python" - "$tmp/recovered.json" "${chunk#$tmp/60/}" <<'PY' || fail "the manifest does not tell the recovery: $(cat "$tmp/recovered.json")"
import json, sys
job = json.load(open(sys.argv[1]))
first, second = job["attempts"]
assert first["host"] == "host-b" and first["restored_step"] == "60", first
assert "restoring the checkpoint" in second["cause"] and second["restored_step"] == "30", second
bad = [c for c in job["checkpoints"] if c.get("restore_error")]
assert [c["step"] for c in bad] == ["60"], bad
assert sys.argv[2] in bad[0]["restore_error"], bad  # names the truncated chunk
# Goodput partitions the runs' wall time: each second once, in one cause.
g = job["goodput"]
badput = sum(g["badput_seconds"].values())
assert abs(badput + g["productive_seconds"] - g["wall_seconds"]) <= 0.01 * g["wall_seconds"], g
assert g["badput_seconds"]["rerun_steps"] > 0 and g["badput_seconds"]["failure"] > 0, g
assert "restore" in g["badput_seconds"] and "init" in g["badput_seconds"], g
print("recovery:", first["cause"][:80], "| then:", second["cause"][:120])
print(f"goodput {g.get('ratio', 0):.2f}: badput {badput:.1f} s of {g['wall_seconds']:.1f} s wall")
PY
grep -q "^-- run 2: restarted from the checkpoint of step 60 " "$tmp/watch.txt" &&
  grep -q "^-- run 3: restarted from the checkpoint of step 30 " "$tmp/watch.txt" ||
  fail "meshrun watch did not show both restarts: $(grep -- "^--" "$tmp/watch.txt")"
wait "$dashboard" || fail "the dashboard through the restarts: $(cat "$tmp/dashboard.log")"
cat "$tmp/dashboard.log"
export_loss "$job" "$tmp/recovered.csv"
same_losses recovered || fail "the recovered run differs from the uninterrupted one"

# A preemption of one host replica: `meshrun checkpoint` commits a step both hosts save, then
# SIGTERM to host-b makes both hosts save one step and stop; the job restarts from that step
# (0 steps lost), read from host-a's memory, once host-b is back, and SUCCEEDS with the
# uninterrupted run's losses.
mkdir "$tmp/preempt"
job=$(cli submit "$lm" --data=synthetic --steps=$steps --cadence=1 --checkpoint_dir="$tmp/preempt" \
  --checkpoint_every=1000)
cli watch "$job" --since_step=1 >"$tmp/watch2.txt" 2>&1 &
pids+=($!)
wait_for "$tmp/watch2.txt" "^ *20 " || fail "the preempted job did not reach step 20"
asked=$(cli --output=json checkpoint "$job" | sed -n 's/.*"step": *"\{0,1\}\([0-9]*\).*/\1/p')
[ -n "$asked" ] && [ "$asked" -gt 20 ] || fail "meshrun checkpoint picked no step: '$asked'"
for _ in $(seq 300); do [ -f "$tmp/preempt/$asked/meshrun_checkpoint.json" ] && break; sleep 0.1; done
[ -f "$tmp/preempt/$asked/meshrun_checkpoint.json" ] ||
  fail "meshrun checkpoint of step $asked on two hosts was not committed: $(ls "$tmp/preempt")"
wait_for "$tmp/watch2.txt" "^ *$((asked + 10)) " || fail "the job did not go on after step $asked"
kill -TERM "${worker_pid[host-b]}"
for _ in $(seq 300); do kill -0 "${worker_pid[host-b]}" 2>/dev/null || break; sleep 0.1; done
kill -0 "${worker_pid[host-b]}" 2>/dev/null && fail "host-b did not exit within 30 s of SIGTERM"
start_worker host-b 1
await_job "$job" "state: JOB_STATE_\(SUCCEEDED\|FAILED\|CANCELLED\)" 1200 || true
cli get "$job" --output=json >"$tmp/preempted.json"
"$src/.venv/bin/python" - "$tmp/preempted.json" <<'PY' || fail "the preemption lost steps: $(cat "$tmp/preempted.json")"
import json, sys
job = json.load(open(sys.argv[1]))
assert job["state"] == "JOB_STATE_SUCCEEDED", (job["state"], job.get("error"))
run = job["attempts"][0]
# The newest checkpoint committed before the restart is the preempted run's last step.
before = max(int(c["step"]) for c in job["checkpoints"]
             if c.get("committed") and int(c["unix_micros"]) <= int(run["end_unix_micros"]))
assert int(run["last_step"]) == before == int(run["restored_step"]), (run, before)
assert int(run.get("steps_lost", 0)) == 0 and "a preemption" in run["cause"], run
assert run["host"] == "host-b" and run["restored_from"] == "memory", run
print(f"preempted after step {run['last_step']}: committed on both hosts, restored from memory, "
      "0 steps lost; SUCCEEDED")
PY
export_loss "$job" "$tmp/preempted.csv"
same_losses preempted || fail "the preempted run differs from the uninterrupted one"

# In-memory checkpoints and a spare: a third host registers as a spare (--spare) and the job's
# first run leaves it out; one host of the job is killed with
# SIGKILL and not started again; the job restarts at once on the survivor and the spare, both
# restoring the newest in-memory step (the survivor its own copy, the spare one fetched from
# it): the step the survivor was at when its peer died, well past the newest disk checkpoint
# (step 50), and SUCCEEDS with the uninterrupted run's
# losses; the manifest says which tier it restored from and which host replaced which.
start_worker host-c 2 --spare
cli workers --expect=3 --wait=30s >"$tmp/workers3.txt" || fail "host-c did not register"
grep -q "^host-c .*spare" "$tmp/workers3.txt" || fail "host-c is not listed as a spare: $(cat "$tmp/workers3.txt")"
mkdir "$tmp/memory"
job=$(cli submit "$lm" --data=synthetic --steps=$steps --cadence=1 --checkpoint_dir="$tmp/memory" \
  --checkpoint_every=50)
cli watch "$job" --since_step=1 >"$tmp/watch3.txt" 2>&1 &
pids+=($!)
wait_for "$tmp/watch3.txt" "^ *73 " || fail "the memory-tier job did not reach step 73"
victim=$(cli --output=textproto get "$job" | sed -n 's/^ *replica_hosts: "\(.*\)"/\1/p' | tail -1)
[ -n "$victim" ] || fail "no replica host in the manifest"
killed_at=$(date +%s.%N)
kill -9 "${worker_pid[$victim]}"
for _ in $(seq 600); do
  grep -A1 "^-- run 2" "$tmp/watch3.txt" | grep -q "^ *[0-9]" && break
  sleep 0.05
done
resumed_at=$(date +%s.%N)
grep -A1 "^-- run 2" "$tmp/watch3.txt" | grep -q "^ *[0-9]" || fail "the job did not go on: $(tail -3 "$tmp/watch3.txt")"
await_job "$job" "state: JOB_STATE_\(SUCCEEDED\|FAILED\|CANCELLED\)" 1200 || true
cli get "$job" --output=json >"$tmp/memory.json"
"$src/.venv/bin/python" - "$tmp/memory.json" "$victim" "$killed_at" "$resumed_at" <<'PY' || fail "the memory-tier restart: $(cat "$tmp/memory.json")"
import json, sys
job = json.load(open(sys.argv[1]))
victim, killed_at, resumed_at = sys.argv[2], float(sys.argv[3]), float(sys.argv[4])
assert job["state"] == "JOB_STATE_SUCCEEDED", (job["state"], job.get("error"))
run = job["attempts"][0]
restored, last = int(run["restored_step"]), int(run["last_step"])
# The survivor kept its state at the step the victim died in (not only every 10th): the restart
# re-runs nothing, or one step whose summary died with the victim. When that step's summary was
# not combined yet as the restart was decided, it restores the copy of step 70 instead.
assert run["restored_from"] == "memory" and (restored >= 73 or restored == 70), run
assert last - restored < 10 and run["host"] == victim, run
assert sorted(run["hosts"]) == ["host-a", "host-b"], run  # the spare waited for a restart
spare = "host-c"
assert run["replaced_hosts"] == {victim: spare}, run
print(f"memory tier: {victim} killed at step {last}, restarted from in-memory step {restored} "
      f"on {spare}; {resumed_at - killed_at:.1f} s from the kill to the next run's first step")
PY
export_loss "$job" "$tmp/memory.csv"
same_losses memory || fail "the run restored from memory differs from the uninterrupted one"

# Both hosts of a run die at once: no surviving host holds an in-memory step, so the job
# restarts from the disk checkpoint of step 50 (on the spare and the first host back), says so
# in its manifest and the coordinator's log, and its losses equal the uninterrupted run's.
start_worker "$victim" "$([ "$victim" = host-a ] && echo 0 || echo 1)"
cli workers --expect=3 --wait=30s >/dev/null || fail "$victim did not come back"
mkdir "$tmp/both"
job=$(cli submit "$lm" --data=synthetic --steps=$steps --cadence=1 --checkpoint_dir="$tmp/both" \
  --checkpoint_every=50)
cli watch "$job" --since_step=1 >"$tmp/watch4.txt" 2>&1 &
pids+=($!)
wait_for "$tmp/watch4.txt" "^ *73 " || fail "the two-host job did not reach step 73"
kill -9 "${worker_pid[host-a]}" "${worker_pid[host-b]}"
sleep 0.5
start_worker host-a 0
await_job "$job" "state: JOB_STATE_\(SUCCEEDED\|FAILED\|CANCELLED\)" 1200 || true
cli get "$job" --output=json >"$tmp/both.json"
"$src/.venv/bin/python" - "$tmp/both.json" <<'PY' || fail "two hosts lost at once: $(cat "$tmp/both.json")"
import json, sys
job = json.load(open(sys.argv[1]))
assert job["state"] == "JOB_STATE_SUCCEEDED", (job["state"], job.get("error"))
run = job["attempts"][0]
assert run["restored_from"] == "disk" and int(run["restored_step"]) == 50, run
PY
grep -q "job $job: no in-memory checkpoint at or past step 50.* covers the run's 2 hosts" \
  "$tmp/coordinator.log" || fail "the coordinator did not say why it read the disk tier"
export_loss "$job" "$tmp/both.csv"
same_losses both || fail "the run restored from disk after losing both hosts differs"
echo "recovery_test: all checks passed"
