#!/usr/bin/env bash
# Runs the main job's worker on an NVIDIA GPU through a CUDA PJRT plugin (docs/pjrt.md): a
# coordinator that leaves compiling to the worker (--pjrt_plugin=), one worker whose runtime is
# the CUDA plugin, and the byte-level LM (examples/transformer_lm/dp1) trained on the fortunes
# token shards. Checks the job succeeds on a "cuda" runtime and its loss falls by a fifth;
# prints the step time and the GPU memory the worker's runtime reports.
#
#   scripts/gpu_check.sh [BIN_DIR]        (default build/bin)
#   MESHRUN_CUDA_PLUGIN=<xla_cuda_plugin.so>  the plugin; default: the one jax-cuda12-pjrt or
#                                         jax-cuda13-pjrt installed for `python3`
#   MESHRUN_GPU_STEPS=300                 training steps
#   MESHRUN_GPU_PLATFORM=cuda             the platform the job must run on (cpu rehearses the
#                                         script with the CPU plugin as MESHRUN_CUDA_PLUGIN)
# Exit 77 where there is no NVIDIA GPU or no CUDA plugin; 1 when the check fails.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${1:-$root/build/bin}"
steps="${MESHRUN_GPU_STEPS:-300}"

if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "gpu_check: SKIP: no NVIDIA GPU here (nvidia-smi lists none)"
  exit 77
fi
plugin="${MESHRUN_CUDA_PLUGIN:-}"
if [[ -z "$plugin" ]]; then
  plugin="$(python3 - <<'PY' 2>/dev/null || true
import glob, os, site
for d in site.getsitepackages():
    for name in ("xla_cuda12", "xla_cuda13"):
        hits = glob.glob(os.path.join(d, "jax_plugins", name, "xla_cuda_plugin.so"))
        if hits:
            print(hits[0]); raise SystemExit
PY
)"
fi
if [[ -z "$plugin" || ! -f "$plugin" ]]; then
  echo "gpu_check: SKIP: no CUDA PJRT plugin (pip install jax-cuda12-pjrt, or set MESHRUN_CUDA_PLUGIN)"
  exit 77
fi
# The plugin finds CUDA's libraries in the nvidia-* packages beside it.
site_dir="$(dirname "$(dirname "$(dirname "$plugin")")")"
for d in "$site_dir"/nvidia/*/lib; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
nvidia-smi -L | head -1
echo "gpu_check: plugin $plugin"

run="$(mktemp -d)"
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait || true
}
trap stop_all EXIT
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$run/coordinator" --pjrt_plugin= \
  --data_root="$root/.data,$root/examples" \
  >"$run/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on port" "$run/coordinator.log" && break; sleep 0.1; done
port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$run/coordinator.log" | head -1)
[[ -n "$port" ]] || { cat "$run/coordinator.log"; exit 1; }
start=$(date +%s.%N)
"$bin/meshrun-worker" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=gpu-0 \
  --pjrt_plugin="$plugin" --cpu_devices=1 --state_dir="$run/worker" \
  --data_root="$root/.data,$root/examples" \
  >"$run/worker.log" 2>&1 &
pids+=($!)
cli() { "$bin/meshrun" --coordinator="127.0.0.1:$port" "$@"; }
if ! cli workers --expect=1 --wait=120s >"$run/workers.txt"; then
  cat "$run/worker.log"; echo "gpu_check: FAIL: the CUDA worker did not register"; exit 1
fi
echo "gpu_check: worker up in $(awk -v s="$start" -v e="$(date +%s.%N)" 'BEGIN { printf "%.1f", e - s }') s"
cat "$run/workers.txt"
data=(--data="$root/.data/fortunes/*.tok")
[[ -d "$root/.data/fortunes" ]] || data=()  # the bundle's own batches
set +e
cli --output=json submit "$root/examples/transformer_lm/dp1/job.json" "${data[@]}" \
  --steps="$steps" --cadence=10 --follow --wait=600s >"$run/manifest.json"
rc=$?
set -e
job="$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["job_id"])' "$run/manifest.json")"
cli get "$job"
if [[ $rc != 0 ]]; then
  tail -20 "$run/worker.log"; echo "gpu_check: FAIL: the job did not succeed (exit $rc)"; exit 1
fi
cli export "$job" --format=csv --series=loss >"$run/loss.csv"
python3 - "$run/manifest.json" "$run/loss.csv" "${MESHRUN_GPU_PLATFORM:-cuda}" <<'PY'
import csv, json, sys
manifest, platform = json.load(open(sys.argv[1])), sys.argv[3]
runtime = manifest["runtime"]
print(f"gpu_check: runtime {runtime['platform_name']} {runtime.get('platform_version', '')}")
if runtime["platform_name"] != platform:
    sys.exit(f"gpu_check: FAIL: the job ran on {runtime['platform_name']}, not {platform}")
rows = list(csv.DictReader(open(sys.argv[2])))
losses = [float(r["value"]) for r in rows]
first, last = losses[0], sum(losses[-5:]) / len(losses[-5:])
print(f"gpu_check: loss {first:.4f} -> {last:.4f} over {len(losses)} logs")
steps = int(rows[-1]["step"]) - int(rows[1]["step"])
micros = int(rows[-1]["wall_time_unix_micros"]) - int(rows[1]["wall_time_unix_micros"])
print(f"gpu_check: {micros / 1000 / steps:.2f} ms per step (steps {rows[1]['step']}..{rows[-1]['step']}, "
      "telemetry wall times)")
if not last < 0.8 * first:
    sys.exit("gpu_check: FAIL: the loss fell less than a fifth")
PY
cli memory gpu-0 || true
echo "gpu_check: PASS"
