#!/usr/bin/env bash
# The block-sparse transformer (examples/transformer_lm/sparse_dp1) through the real binaries on
# loopback: a coordinator and one worker (XLA's CPU PJRT plugin, one device). The worker builds
# each batch's plan tables from its document ids, and the boundaries move every batch; over 200
# steps:
#   1. the job SUCCEEDS, compiled once by the coordinator (cache miss);
#   2. the worker loaded the step executable once (LoadTime: init + step = 2 samples), compiled
#      nothing but its telemetry reduction (CompileTime: 1), and planned once per step;
#   3. active_tile_fraction arrives as telemetry and varies between logging steps;
#   4. a contract whose block size does not divide the sequence is refused at submit, naming it.
# Usage: sparse_job_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/transformer_lm/sparse_dp1/job.json"
steps=200
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$bundle" ] || fail "bundle $bundle missing"

# One CPU device each: the example is dp1 and a mesh spans every device of its hosts.
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" --cpu_devices=1 \
  >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=worker-0 \
  --worker_index=0 --cpu_devices=1 --state_dir="$tmp/worker-0" >"$tmp/worker-0.log" 2>&1 &
pids+=($!)
cli workers --expect=1 --wait=30s >/dev/null || fail "worker did not register"

# 1. 200 steps, telemetry every step (the 20 batches cycle, so cadence 10 would see only two).
cli submit "$bundle" --steps=$steps --cadence=1 --follow --output=textproto --wait=400s >"$tmp/job.txt" \
  || fail "sparse job did not succeed: $(cat "$tmp/job.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job.txt" || fail "job state: $(cat "$tmp/job.txt")"
[ "$(field last_step <"$tmp/job.txt")" = "$steps" ] || fail "last_step"
grep -q "cache_hit: true" "$tmp/job.txt" && fail "the job should compile (cache miss)"
job=$(field job_id <"$tmp/job.txt")

# 2. One load of init + step, one compile (the telemetry reduction), a plan per step.
cli metrics worker-0 >"$tmp/metrics.txt" || fail "metrics failed"
samples() { awk -v m="$1" '$1 == "Metric:" && $2 == m { getline; print $2 }' "$tmp/metrics.txt"; }
[ "$(samples LoadTime)" = "2" ] \
  || fail "LoadTime samples $(samples LoadTime), want 2: $(cat "$tmp/metrics.txt")"
[ "$(samples CompileTime)" = "1" ] || fail "CompileTime samples $(samples CompileTime), want 1"
plans=$(samples PlanTime)
# The prefetcher may have planned one batch ahead of the last step.
[ -n "$plans" ] && [ "$plans" -ge $steps ] && [ "$plans" -le $((steps + 2)) ] \
  || fail "PlanTime samples '$plans', want about $steps"
grep -q "Metric: ExecuteTime" "$tmp/metrics.txt" || fail "no ExecuteTime"

# 3. active_tile_fraction is the third series: at every step it equals what JAX computed for
#    that step's batch (reference.json, 20 batches cycled), and it moves.
cli watch "$job" --since_step=1 >"$tmp/watch.txt" || fail "watch failed: $(cat "$tmp/watch.txt")"
grep -q "active_tile_fr" "$tmp/watch.txt" \
  || fail "no active_tile_fraction column: $(cat "$tmp/watch.txt")"
rows=$(awk '$1 ~ /^[0-9]+$/' "$tmp/watch.txt" | wc -l)
[ "$rows" -eq $steps ] || fail "watch rows $rows: $(cat "$tmp/watch.txt")"
awk '/"active_tile_fraction"/ { on = 1; next } on && /\]/ { exit } on { print $1 + 0 }' \
  "$(dirname "$bundle")/reference.json" >"$tmp/expected.txt"
[ "$(wc -l <"$tmp/expected.txt")" -eq 20 ] || fail "reference.json has no 20 active fractions"
awk 'NR == FNR { want[NR - 1] = $1; next }
     $1 ~ /^[0-9]+$/ { w = want[($1 - 1) % 20]; if ($4 - w > 1e-5 || w - $4 > 1e-5) {
       print "step " $1 ": active_tile_fraction " $4 ", JAX " w; bad = 1 } }
     END { exit bad }' "$tmp/expected.txt" "$tmp/watch.txt" >"$tmp/diff.txt" \
  || fail "active_tile_fraction differs from JAX's: $(cat "$tmp/diff.txt")"
distinct=$(awk '$1 ~ /^[0-9]+$/ { print $4 }' "$tmp/watch.txt" | sort -u | wc -l)
[ "$distinct" -ge 3 ] || fail "active_tile_fraction barely changed: $(cat "$tmp/watch.txt")"

# 4. An illegal contract is refused at submit, naming the field; the coordinator keeps serving.
# A copy of the bundle beside links to its files, with block_q 24 (64 tokens are not 24-blocks).
bad="$tmp/bundle/transformer_lm/sparse_bad"
mkdir -p "$bad"
ln -s "$src/examples/jax_compile_options" "$tmp/bundle/jax_compile_options"
ln -s "$src/examples/transformer_lm/sparse_data.bin" "$tmp/bundle/transformer_lm/sparse_data.bin"
for f in init.mlirbc step.mlirbc reference.json; do ln -s "$(dirname "$bundle")/$f" "$bad/$f"; done
sed 's/"block_q": 16/"block_q": 24/' "$bundle" >"$bad/job.json"
if cli submit "$bad/job.json" --steps=10 >"$tmp/bad.txt" 2>&1; then fail "block_q 24 accepted"; fi
grep -q "spec.sparse_attention.*block_q=24 does not divide seq_len=64" "$tmp/bad.txt" \
  || fail "refusal does not name the field: $(cat "$tmp/bad.txt")"
[ "$("$bin/meshrun" health "127.0.0.1:$port")" = "SERVING" ] || fail "coordinator harmed"
echo "PASS: $steps sparse steps, one load, active_tile_fraction took $distinct values"
