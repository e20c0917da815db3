#!/usr/bin/env bash
# The main job: sets up, builds, starts a coordinator and two workers on loopback (4 CPU
# devices each, XLA's CPU PJRT plugin), submits the byte-level transformer LM across both
# (host replicas: each runs a 4-device SPMD program on half of every batch, and they average
# gradients with gloo each step; docs/multihost_cpu.md) on real text (token shards of the
# fortunes corpus that setup wrote to .data/fortunes, docs/data.md), prints its telemetry live
# (loss, grad norm, sink mass, step time), ends with the job manifest and its data receipt,
# checks the loss fell at least 30% from its first value, then drains the cluster with SIGTERM.
# The coordinator also serves the web dashboard and Prometheus /metrics on the printed URL (MESHRUN_DEMO_HTTP, default 127.0.0.1:0 = a free port).
# MESHRUN_DEMO_STEPS sets the step count (default 800: under 2 minutes on 2 cores; the loss falls
# about 39%); MESHRUN_DEMO_KEEP=1 keeps the cluster running until Ctrl-C.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
start=$(date +%s)
# Only what the demo runs: no JAX venv, SDK, torch, libtpu or test-only tools (scripts/setup.sh).
bash scripts/setup.sh --demo
setup_done=$(date +%s)
# Only the three binaries and the dashboard the coordinator serves, in a tree of their own that
# compiles fast: a unity build (MESHRUN_UNITY: a library's sources in a few compiler runs, so
# the gRPC and protobuf headers are parsed a few times, not once per file), -O1, no debug
# information. The job's time is spent in XLA's plugin, not in these binaries. CMake's own
# unity build stays off (trees configured before MESHRUN_UNITY had it on): its files would
# batch protoc's, which clash. scripts/test.sh builds build/.
bash scripts/build.sh build-demo -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DMESHRUN_UNITY=ON -DCMAKE_UNITY_BUILD=OFF \
  -DMESHRUN_BUILD_TESTS=OFF -DMESHRUN_BUILD_BENCH=OFF \
  -- meshrun-coordinator meshrun-worker meshrun web_assets
build_done=$(date +%s)
echo "demo: set up in $((setup_done - start))s, built in $((build_done - setup_done))s"
bin="$root/build-demo/bin"
run="$(mktemp -d)"
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait || true
}
trap stop_all EXIT INT TERM

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$run/coordinator" --data_root="$root/.data" \
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
    --data_root="$root/.data,$root/examples" \
    --host="local-worker-$w" --worker_index=$w --state_dir="$run/worker-$w" --cpu_devices=4 \
    >"$run/worker-$w.log" 2>&1 &
  pids+=($!)
done
"$bin/meshrun" health "127.0.0.1:$port"
"$bin/meshrun" --coordinator="127.0.0.1:$port" workers --expect=2 --wait=30s
cli() { "$bin/meshrun" --coordinator="127.0.0.1:$port" "$@"; }
job=$(cli submit "$root/examples/transformer_lm/dp4x2/job.json" --data="$root/.data/fortunes/*.tok" \
  --steps="${MESHRUN_DEMO_STEPS:-800}" --cadence=10)
echo "demo: submitted $job (compiling once, then streaming the executables to both workers)"
cli watch "$job" | tee "$run/telemetry.txt"
echo "demo: manifest of $job"
cli get "$job" | tee "$run/manifest.txt"
cli --output=textproto get "$job" >"$run/manifest.textproto"
grep -q "state: JOB_STATE_SUCCEEDED" "$run/manifest.textproto" || { echo "demo: the job did not succeed"; exit 1; }
# A batch is 8 rows of 64 bytes, so one logged loss is noisy: the end is the mean of the last
# five logged values.
awk 'NR > 1 && $1 ~ /^[0-9]+$/ { if (!first) first = $2; last[n++ % 5] = $2 }
     END { if (n < 6) { print "demo: too few loss values"; exit 1 }
           for (i = 0; i < 5; i++) end += last[i] / 5
           drop = 100 * (first - end) / first
           printf "demo: loss %.4f -> %.4f (mean of the last 5 logs; %.0f%% lower)\n", first, end, drop
           if (drop < 30) { print "demo: the loss fell less than 30%"; exit 1 } }' \
  "$run/telemetry.txt"
if [ "${MESHRUN_DEMO_KEEP:-0}" = "1" ]; then
  echo "demo: running; dashboard at http://127.0.0.1:$http/; try: $bin/meshrun --coordinator=127.0.0.1:$port workers   (Ctrl-C stops)"
  wait "${pids[0]}"
fi
echo "demo: draining the cluster"
stop_all
trap - EXIT
echo "demo: done in $(( $(date +%s) - start ))s"
