#!/usr/bin/env bash
# Goodput through lost hosts (docs/checkpoints.md, "Memory tier"), through the real binaries on
# loopback: transformer_lm/dp4x2 on two host replicas of 4 CPU devices, disk checkpoints every
# 100 steps, in-memory checkpoints every 10 (the default), a spare registered (--spare). Three
# runs of STEPS steps, each on a fresh cluster:
#   clean:   uninterrupted: its mean step time (first to last step) is the baseline;
#   kill9:   a replica host killed (-9) at 35 % and at 68 % of the steps;
#   sigterm: the same hosts stopped with SIGTERM instead (the worker drains).
# A killed or stopped host is started again at once as a spare (a fresh incarnation).
# Goodput by wall clock: STEPS x the clean mean step / the run's time from its first step to its
# last (plus one step). Prints the figures, then
#   ratio goodput_kill9 <goodput>      (goal >= 0.98)
#   ratio goodput_sigterm <goodput>    (goal >= 0.99), the last line.
# Usage: bash bench/goodput_bench.sh <directory of the binaries> <source directory> [steps]
set -euo pipefail
bin=$1
src=$2
steps=${3:-600}
source "$src/bench/cluster_rounds_lib.sh"
# Prefixes each line with the time it arrived.
stamp() { python3 -u -c 'import sys, time
for line in sys.stdin: print(f"{time.time():.3f} {line}", end="", flush=True)'; }
# When step $2 was first (or, with $3=last, last) seen in watch file $1.
seen_at() { awk -v s="$2" '$2 == s { t = $1; if (!n++) f = $1 } END { print ('"${3:-0}"' ? t : f) }' "$1"; }
# One run of mode $1; prints "<first step time> <last step time> <restarts>".
run() {
  local mode=$1 dir="$tmp/$1" job victim at
  declare -A pid_of index_of=([host-a]=0 [host-b]=1 [host-c]=2)
  mkdir -p "$dir/ck"
  "$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$dir/c" --data_root="$tmp" \
    --heartbeat_timeout=2s --restart_wait=60s >"$dir/c.log" 2>&1 &
  track $!
  await_coordinator "$dir/c.log"
  pid_of[host-a]=$(start_worker "$dir" host-a 0)
  pid_of[host-b]=$(start_worker "$dir" host-b 1)
  pid_of[host-c]=$(start_worker "$dir" host-c 2 --spare)
  cli workers --expect=3 --wait=30s >/dev/null || fail "workers did not register"
  job=$(cli submit "$lm" --data=synthetic --steps="$steps" --cadence=1 --checkpoint_dir="$dir/ck" \
    --checkpoint_every=100)
  cli watch "$job" --since_step=1 2>&1 | stamp >"$dir/watch.txt" &
  track $!
  if [ "$mode" != clean ]; then
    for at in $((steps * 35 / 100)) $((steps * 68 / 100)); do
      for _ in $(seq 6000); do grep -q "^[0-9.]* *$at " "$dir/watch.txt" && break; sleep 0.05; done
      victim=$(cli --output=textproto get "$job" | sed -n 's/^ *replica_hosts: "\(.*\)"/\1/p' | tail -1)
      kill "-$([ "$mode" = kill9 ] && echo KILL || echo TERM)" "${pid_of[$victim]}"
      while kill -0 "${pid_of[$victim]}" 2>/dev/null; do sleep 0.05; done  # drained
      pid_of[$victim]=$(start_worker "$dir" "$victim" "${index_of[$victim]}" --spare)
    done
  fi
  await_job "$job" "state: JOB_STATE_\(SUCCEEDED\|FAILED\|CANCELLED\)" 3000 || true
  job_shows "$job" "state: JOB_STATE_SUCCEEDED" || fail "the $mode run did not succeed"
  [ -n "${KEEP_LOGS:-}" ] && cp -r "$dir" "$KEEP_LOGS.$mode"
  echo "$(seen_at "$dir/watch.txt" 1) $(seen_at "$dir/watch.txt" "$steps" 1) $(cli --output=json get "$job" | python3 -c 'import json, sys; print(len(json.load(sys.stdin).get("attempts", [])))')"
  end_round
}
read -r f0 l0 _ <<<"$(run clean)"
mean=$(awk -v f="$f0" -v l="$l0" -v n="$steps" 'BEGIN { printf "%.5f", (l - f) / (n - 1) }')
echo "clean: $steps steps in $(awk -v f="$f0" -v l="$l0" 'BEGIN { printf "%.1f", l - f }') s, mean step ${mean} s"
lines=()
for mode in kill9 sigterm; do
  read -r f l restarts <<<"$(run $mode)"
  echo "$mode: $restarts restarts, first to last step $(awk -v f="$f" -v l="$l" 'BEGIN { printf "%.1f", l - f }') s"
  lines+=("$(awk -v f="$f" -v l="$l" -v m="$mean" -v n="$steps" -v name="goodput_$mode" \
    'BEGIN { printf "ratio %s %.4f", name, n * m / (l - f + m) }')")
done
printf '%s\n' "${lines[@]}"
