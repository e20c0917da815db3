#!/usr/bin/env bash
# Fine-tuning weights trained elsewhere (docs/checkpoints.md): JAX trains the MLP example 20
# steps and saves its state with orbax.checkpoint itself (use_ocdbt=False, Orbax's zstd chunks,
# no meshrun manifest); meshrun resumes a dp4_tp2 job from that directory for steps 21..30 and
# its losses equal JAX's own continuation of the same state within 1e-5 relative (two XLA
# builds). A checkpoint saved with OCDBT is refused at submit, by name. The job's goodput is in
# `meshrun get` and /metrics (ratio in (0, 1], badput with a "restore" cause).
# Usage: checkpoint_orbax_resume_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
python="$src/.venv/bin/python"
[ -x "$python" ] || { echo "SKIP: $python absent (scripts/setup.sh)"; exit 77; }
source "$(dirname "$0")/cluster_lib.sh"
"$python" "$src/tests/orbax_written.py" mlp "$tmp/jax" 20 10 2>/dev/null >"$tmp/jax.csv" \
  || fail "JAX/orbax could not write the checkpoint"
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  --state_dir="$tmp/coordinator" --data_root="$tmp" >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
http=$(sed -n 's/.*HTTP on port \([0-9]*\).*/\1/p' "$tmp/coordinator.log" | head -1)
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=w8 \
  --cpu_devices=8 --state_dir="$tmp/w8" >"$tmp/w8.log" 2>&1 &
pids+=($!)
cli workers --expect=1 --wait=30s >/dev/null || fail "the worker did not register"

mlp="$src/examples/mlp_classifier/dp4_tp2/job.json"
cli submit "$mlp" --steps=30 --cadence=1 --resume_from="$tmp/jax" --follow --output=textproto --wait=120s \
  >"$tmp/resumed.txt" || fail "the resumed job did not succeed: $(cat "$tmp/resumed.txt")"
grep -q "restored_step: 20" "$tmp/resumed.txt" || fail "no restored_step: $(cat "$tmp/resumed.txt")"
cli export "$(field job_id <"$tmp/resumed.txt")" --format=csv --series=loss \
  --out="$tmp/resumed.csv" 2>/dev/null || fail "export failed"
awk -F, 'FNR == 1 { next }
  FNR == NR { want[$1] = $2; next }
  ($1 in want) { n++; d = ($6 - want[$1]) / want[$1]; d = d < 0 ? -d : d; if (d > worst) worst = d }
  END { printf "meshrun from JAX'"'"'s checkpoint, steps 21..30: %d steps, worst relative difference %.2e\n", n, worst;
        exit !(n == 10 && worst <= 1e-5) }' "$tmp/jax.csv" "$tmp/resumed.csv" \
  || fail "meshrun's steps 21..30 differ from JAX's: $(cat "$tmp/jax.csv" "$tmp/resumed.csv")"

# Goodput: in the manifest and on /metrics.
job=$(field job_id <"$tmp/resumed.txt")
cli --output=textproto get "$job" >"$tmp/get.txt"
ratio=$(sed -n '/^goodput {/,/^}/s/^  ratio: //p' "$tmp/get.txt")
awk -v r="$ratio" 'BEGIN { exit !(r > 0 && r <= 1) }' || fail "goodput ratio '$ratio': $(cat "$tmp/get.txt")"
grep -A2 'key: "restore"' "$tmp/get.txt" | grep -q "value:" || fail "no restore badput: $(cat "$tmp/get.txt")"
curl -sf "http://127.0.0.1:$http/metrics" >"$tmp/metrics.txt" || fail "/metrics"
grep -q "^meshrun_job_goodput_ratio{job_id=\"$job\"} " "$tmp/metrics.txt" || fail "no goodput on /metrics"
grep -q "^meshrun_job_badput_seconds{.*cause=\"compile\"" "$tmp/metrics.txt" || fail "no badput on /metrics"
cli get "$job" >"$tmp/summary.txt"
grep -q "^goodput: .*% of .* s; badput: " "$tmp/summary.txt" &&
  grep -q "(resumed from step 20)" "$tmp/summary.txt" || fail "meshrun get: $(cat "$tmp/summary.txt")"
echo "goodput of the resumed job: $ratio ($(grep goodput "$tmp/summary.txt"))"

# A checkpoint saved with OCDBT (Orbax's default): refused, saying how to save instead.
"$python" "$src/tests/orbax_written.py" values "$tmp/values" >/dev/null 2>&1 \
  || fail "could not write the OCDBT checkpoint"
if cli submit "$mlp" --steps=30 --resume_from="$tmp/values/ocdbt" >"$tmp/refused.txt" 2>&1; then
  fail "an OCDBT checkpoint was accepted"
fi
grep -q "use_ocdbt=False" "$tmp/refused.txt" || fail "OCDBT refusal unclear: $(cat "$tmp/refused.txt")"
echo "ok"
