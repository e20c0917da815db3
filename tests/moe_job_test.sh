#!/usr/bin/env bash
# A compile mode B (MoE) job through the real binaries on loopback: a coordinator and one worker
# (8 CPU devices, XLA's CPU PJRT plugin), examples/transformer_moe/dp8 submitted with the CLI.
#   the MoE job SUCCEEDS in compile mode B with init, grad and apply compiled and sent once,
#      and its telemetry (mean loss over each step's micro-batches) falls.
# Usage: moe_job_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/transformer_moe/dp8/job.json"
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$bundle" ] || fail "bundle $bundle missing"

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" \
  >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=worker-0 \
  --worker_index=0 --state_dir="$tmp/worker-0" >"$tmp/worker-0.log" 2>&1 &
pids+=($!)
cli workers --expect=1 --wait=30s >/dev/null || fail "worker did not register"

# The MoE job: 20 steps of 2 grad micro-steps + apply, telemetry every step.
cli submit "$bundle" --steps=20 --cadence=1 --follow --output=textproto --wait=300s >"$tmp/job.txt" \
  || fail "MoE job did not succeed: $(cat "$tmp/job.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job.txt" || fail "job state: $(cat "$tmp/job.txt")"
grep -q 'compile_mode: "B"' "$tmp/job.txt" || fail "compile mode is not B"
grep -q "grad_accumulation: 2" "$tmp/job.txt" || fail "grad_accumulation not in the manifest"
for role in init grad apply; do
  grep -q "key: \"$role\"" "$tmp/job.txt" || fail "no $role executable in the manifest"
done
grep -q 'key: "step"' "$tmp/job.txt" && fail "a mode B job compiled a step program"
grep -q "mode B, 2 micro-steps each" "$tmp/worker-0.log" || fail "the worker did not run mode B"
job=$(sed -n 's/^job_id: "\(.*\)"$/\1/p' "$tmp/job.txt" | head -1)
cli watch "$job" --since_step=1 >"$tmp/watch.txt" || fail "watch failed: $(cat "$tmp/watch.txt")"
grep -q "expert_load" "$tmp/watch.txt" || fail "no expert load column"
awk '$1 ~ /^[0-9]+$/ { if (!first) first = $2; last = $2; rows++ }
     END { if (rows != 20 || !(last < 0.7 * first)) exit 1;
           printf "moe loss %.4f -> %.4f over %d steps\n", first, last, rows }' "$tmp/watch.txt" \
  || fail "loss did not fall by 30% over 20 rows: $(cat "$tmp/watch.txt")"
echo "moe_job_test: all checks passed"
