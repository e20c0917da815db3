#!/usr/bin/env bash
# The worker with libtpu on a host without TPU chips: it exits within 10 s with one line naming
# the cause and the fix, and SIGTERM during its start-up (inside plugin loading, or while it
# waits on a metadata server) ends it within 2 s.
#   tpu_worker_start_test.sh <bin dir> <source dir>
set -euo pipefail
bin="$1" src="$2"
libtpu="$src/.deps/libtpu/0.0.51/libtpu.so"
[[ -f "$libtpu" ]] || { echo "SKIP: $libtpu missing (scripts/fetch_libtpu.sh)"; exit 77; }
work="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
worker() {  # run in the background only: it replaces the subshell
  exec env -u TPU_WORKER_ID -u TPU_WORKER_HOSTNAMES -u TPU_ACCELERATOR_TYPE -u TPU_SKIP_MDS_QUERY \
    "$bin/meshrun-worker" --pjrt_plugin="$libtpu" --listen=127.0.0.1:0 \
    --coordinator=127.0.0.1:9 --state_dir="$work/state" "$@"
}
now() { date +%s.%N; }
elapsed() { echo "$(now) - $1" | bc; }

# 1. No TPU chips: one line with cause and fix, within 10 s.
start=$(now)
set +e
timeout 30 env -u TPU_WORKER_ID -u TPU_WORKER_HOSTNAMES -u TPU_ACCELERATOR_TYPE \
  -u TPU_SKIP_MDS_QUERY "$bin/meshrun-worker" --pjrt_plugin="$libtpu" --listen=127.0.0.1:0 \
  --coordinator=127.0.0.1:9 --state_dir="$work/state" --tpu_metadata=off >"$work/out1" 2>&1
rc=$?
set -e
took=$(elapsed "$start")
line="$(grep 'meshrun-worker: error:' "$work/out1" || true)"
echo "no chips: exit $rc after ${took}s: $line"
[[ $rc == 1 ]] || { cat "$work/out1"; echo "FAIL: exit $rc, expected 1"; exit 1; }
(( $(echo "$took < 10" | bc) )) || { echo "FAIL: took ${took}s (limit 10)"; exit 1; }
[[ "$line" == *"libtpu found no TPU chips on this host"*"run the worker on a TPU VM"* ]] ||
  { cat "$work/out1"; echo "FAIL: the line does not name the cause and the fix"; exit 1; }
grep -q "libtpu gets TPU_WORKER_ID=0 TPU_WORKER_HOSTNAMES=.* TPU_SKIP_MDS_QUERY=1" "$work/out1" ||
  { echo "FAIL: the worker did not hand libtpu its identity"; exit 1; }

# 2. SIGTERM while start-up waits: a metadata server that accepts and never answers, and
# SIGTERM inside plugin loading (0.3 s in: hashing and loading a 575 MB plugin takes longer).
"$src/.venv/bin/python" -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(16)
print(s.getsockname()[1], flush=True)
conns = []
end = time.time() + 60
while time.time() < end:
    s.settimeout(1)
    try: conns.append(s.accept()[0])
    except OSError: pass
' >"$work/port" &
pids+=($!)
for _ in $(seq 50); do [[ -s "$work/port" ]] && break; sleep 0.1; done
port="$(head -1 "$work/port")"
term_during_start() {  # <name> <seconds before SIGTERM> <worker flag>
  local name="$1" delay="$2" flag="$3" pid rc took start
  worker "$flag" >"$work/out-$name" 2>&1 &
  pid=$!
  pids+=($pid)
  sleep "$delay"
  start=$(now)
  kill -TERM "$pid"
  set +e
  for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
  wait "$pid"
  rc=$?
  set -e
  took=$(elapsed "$start")
  echo "SIGTERM during start-up ($name): exit $rc after ${took}s: $(grep 'meshrun-worker:' "$work/out-$name" | tail -1)"
  (( $(echo "$took < 2" | bc) )) || { cat "$work/out-$name"; echo "FAIL: took ${took}s (limit 2)"; exit 1; }
  grep -q "during start-up" "$work/out-$name" ||
    { cat "$work/out-$name"; echo "FAIL: no start-up line"; exit 1; }
}
term_during_start metadata 1.0 "--tpu_metadata=127.0.0.1:$port"
term_during_start plugin 0.3 --tpu_metadata=off
echo "PASS"
