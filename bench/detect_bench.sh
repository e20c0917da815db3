#!/usr/bin/env bash
# Detection time of a dead and of a hung host against the configured bounds (docs/liveness.md),
# through the real binaries on loopback: transformer_lm/dp4x2 on two workers of 4 CPU devices.
#   dead:   host-b killed (-9) mid-job, coordinator --heartbeat_timeout=2s; bound 2 x timeout.
#           Its sockets close, so host-a's all-reduce usually fails first and names host-b in
#           well under a second: this measures the peer's report, not the heartbeat.
#   silent: host-b SIGSTOPped mid-job with hang detection off (--hang_timeout=0) and
#           --heartbeat_timeout=2s: its sockets stay open and gloo waits 60 s, so only the
#           missed heartbeats can tell; bound 2 x timeout. This is the heartbeat bound.
#   hung:   host-b SIGSTOPped mid-job, --hang_timeout=4s (heartbeat timeout 60s, so only the
#           progress check can see it); bound 1.5 x hang timeout.
# Prints each detection time and bound, per kind the spread (min / median / max) and bound /
# slowest, then `ratio dead_detect_vs_bound <bound / worst detection time over all kinds>`
# (>= 1.0: every kind detected within its bound).
# Usage: bash bench/detect_bench.sh <directory of the binaries> <source directory> [rounds]
set -euo pipefail
bin=$1
src=$2
rounds=${3:-3}
source "$src/tests/cluster_lib.sh"
fortune_shards
lm="$src/examples/transformer_lm"
now() { date +%s.%N; }
# Rounds run in $(...) subshells: their processes are listed in a file the exit trap reads.
track() { echo "$1" >>"$tmp/round_pids"; }
trap 'for p in $(cat "$tmp/round_pids" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done; cleanup' EXIT
# One round: coordinator flags, signal for host-b; prints the seconds to FAILED.
round() {
  local flags=$1 signal=$2 dir="$tmp/r$RANDOM"
  mkdir -p "$dir"
  "$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$dir/c" --data_root="$tmp" $flags >"$dir/c.log" 2>&1 &
  local cpid=$!
  track $cpid
  await_coordinator "$dir/c.log"
  local wa wb
  "$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=host-a \
    --worker_index=0 --cpu_devices=4 --state_dir="$dir/a" >"$dir/a.log" 2>&1 &
  wa=$!; track $wa
  "$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=host-b \
    --worker_index=1 --cpu_devices=4 --state_dir="$dir/b" >"$dir/b.log" 2>&1 &
  wb=$!; track $wb
  cli workers --expect=2 --wait=30s >/dev/null || fail "workers did not register"
  local job
  job=$(cli submit "$lm/dp4x2/job.json" --steps=1000000 --cadence=1 --data="$tmp/shards/*.tok")
  cli watch "$job" --since_step=1 >"$dir/watch.txt" 2>&1 &
  track $!
  wait_for "$dir/watch.txt" "^ *5 " || fail "no step 5"
  kill -"$signal" "$wb"
  local t0 t1
  t0=$(now)
  for _ in $(seq 600); do cli --output=textproto get "$job" | grep -q "JOB_STATE_FAILED" && break; sleep 0.05; done
  t1=$(now)
  cli --output=textproto get "$job" | grep -q 'failed_host: "host-b"' || fail "host-b not named"
  kill -9 "$cpid" "$wa" "$wb" 2>/dev/null || true
  awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f\n", b - a }'
}
worst=0
for kind in dead silent hung; do
  case $kind in
    dead) flags="--heartbeat_timeout=2s"; signal=KILL; bound=4 ;;
    silent) flags="--heartbeat_timeout=2s --hang_timeout=0s"; signal=STOP; bound=4 ;;
    hung) flags="--heartbeat_timeout=60s --hang_timeout=4s"; signal=STOP; bound=6 ;;
  esac
  times=()
  for r in $(seq "$rounds"); do
    t=$(round "$flags" $signal)
    echo "$kind host detected in ${t}s (bound ${bound}s; $flags)"
    times+=("$t")
  done
  printf '%s\n' "${times[@]}" | sort -n | awk -v k=$kind -v b=$bound '{ t[NR] = $1 } END {
    med = NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2
    printf "%s: %d rounds, detected in min %.2f / median %.2f / max %.2f s (bound %d s); bound / slowest %.2f (per round %.2f .. %.2f)\n",
      k, NR, t[1], med, t[NR], b, b / t[NR], b / t[NR], b / t[1] }'
  for t in "${times[@]}"; do
    worst=$(awk -v w="$worst" -v t="$t" -v b="$bound" 'BEGIN { r = t / b; print (r > w ? r : w) }')
  done
done
awk -v w="$worst" 'BEGIN { printf "ratio dead_detect_vs_bound %.2f\n", 1 / w }'
