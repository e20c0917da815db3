#!/usr/bin/env bash
# The main job: sets up, builds, starts a coordinator and two workers on loopback (8 CPU
# devices each, XLA's CPU PJRT plugin), submits the byte-level transformer LM (SPMD over 8
# devices), prints its telemetry live (loss, grad norm, sink mass, step time), ends with the
# job manifest, then drains the cluster with SIGTERM. The coordinator also serves the web
# dashboard and Prometheus /metrics on the printed URL (MESHRUN_DEMO_HTTP, default
# 127.0.0.1:0 = a free port). MESHRUN_DEMO_STEPS sets the step count; MESHRUN_DEMO_KEEP=1 keeps
# the cluster running until Ctrl-C.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
bash scripts/setup.sh
bash scripts/build.sh build
bin="$root/build/services"
run="$(mktemp -d)"
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait || true
}
trap stop_all EXIT INT TERM

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$run/coordinator" \
  --http_listen="${MESHRUN_DEMO_HTTP:-127.0.0.1:0}" >"$run/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q "listening on port" "$run/coordinator.log" && break; sleep 0.1; done
port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$run/coordinator.log" | head -1)
[ -n "$port" ] || { cat "$run/coordinator.log"; exit 1; }
http=$(sed -n 's/.*HTTP on port \([0-9]*\).*/\1/p' "$run/coordinator.log" | head -1)
echo "demo: coordinator on 127.0.0.1:$port (logs in $run)"
echo "demo: dashboard at http://127.0.0.1:$http/  (Prometheus text at http://127.0.0.1:$http/metrics)"
for w in 0 1; do
  "$bin/meshrun-worker" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" \
    --host="local-worker-$w" --worker_index=$w --state_dir="$run/worker-$w" --cpu_devices=8 \
    >"$run/worker-$w.log" 2>&1 &
  pids+=($!)
done
"$bin/meshrun" health "127.0.0.1:$port"
"$bin/meshrun" --coordinator="127.0.0.1:$port" workers --expect=2 --wait=30s
cli() { "$bin/meshrun" --coordinator="127.0.0.1:$port" "$@"; }
job=$(cli submit "$root/examples/transformer_lm/dp8/job.json" \
  --steps="${MESHRUN_DEMO_STEPS:-200}" --cadence=10)
echo "demo: submitted $job (compiling once, then streaming the executable to a worker)"
cli watch "$job" | tee "$run/telemetry.txt"
echo "demo: manifest of $job"
cli get "$job" | tee "$run/manifest.txt"
awk 'NR > 1 && $1 ~ /^[0-9]+$/ { if (!first) first = $2; last = $2 }
     END { if (first) printf "demo: loss %.4f -> %.4f (%.0f%% lower)\n", first, last, 100 * (first - last) / first }' \
  "$run/telemetry.txt"
grep -q "state: JOB_STATE_SUCCEEDED" "$run/manifest.txt" || { echo "demo: the job did not succeed"; exit 1; }
if [ "${MESHRUN_DEMO_KEEP:-0}" = "1" ]; then
  echo "demo: running; dashboard at http://127.0.0.1:$http/; try: $bin/meshrun --coordinator=127.0.0.1:$port workers   (Ctrl-C stops)"
  wait "${pids[0]}"
fi
echo "demo: draining the cluster"
stop_all
trap - EXIT
echo "demo: done"
