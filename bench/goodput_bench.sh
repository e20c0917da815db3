#!/usr/bin/env bash
# Goodput through lost hosts (docs/checkpoints.md, "Memory tier"), through the real binaries on
# loopback: transformer_lm/dp4x2 on two host replicas of 4 CPU devices, disk checkpoints every
# 100 steps, in-memory checkpoints every 10 (the default), a spare registered (--spare). Three
# runs of STEPS steps, each on a fresh cluster:
#   clean:   uninterrupted;
#   kill9:   a replica host killed (-9) at 35 % and at 68 % of the steps (1050 and 2040 of the
#            default 3000, as the goal is stated);
#   sigterm: the same hosts stopped with SIGTERM instead (the worker drains).
# A killed or stopped host is started again at once as a spare (a fresh incarnation).
# Goodput by wall clock: STEPS x the mean step time / the run's time from its first step to its
# last (plus one step). The mean step time is the run's own median STEP_TIME (what the hosts
# measured, as `meshrun watch` shows it): runs on these machines drift by +-5 % in speed, more
# than two restarts cost, so the clean run's mean would measure the drift; the clean run shows
# the estimator's own bias (time between steps that STEP_TIME does not count), which the ratios
# divide out. Prints each run's figures, then
#   ratio goodput_kill9 <goodput>      (goal >= 0.98)
#   ratio goodput_sigterm <goodput>    (goal >= 0.99), the last line.
# Usage: bash bench/goodput_bench.sh <directory of the binaries> <source directory> [steps]
#   (MODES="clean sigterm" runs only those; clean comes first, for its bias)
set -euo pipefail
bin=$1
src=$2
steps=${3:-3000}
source "$src/bench/cluster_rounds_lib.sh"
# Prefixes each line with the time it arrived.
stamp() { python3 -u -c 'import sys, time
for line in sys.stdin: print(f"{time.time():.3f} {line}", end="", flush=True)'; }
# From watch file $1 of a run of $2 steps: "<goodput> <first to last step, s> <median step, s>".
goodput_of() {
  python3 - "$1" "$2" <<'PY'
import statistics, sys
first, step_times = {}, []
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) > 2 and parts[1].isdigit():
        first.setdefault(int(parts[1]), float(parts[0]))
        step_times += [float(p[:-2]) / 1e3 for p in parts if p.endswith("ms")]
steps = int(sys.argv[2])
step = statistics.median(step_times)
span = max(first.values()) - first[1]
print(f"{steps * step / (span + step):.4f} {span:.1f} {step:.4f}")
PY
}
# One run of mode $1; prints "<goodput> <first to last step, s> <median step, s> <restarts>".
run() {
  local mode=$1 dir="$tmp/$1" job victim at
  declare -A pid_of index_of=([host-a]=0 [host-b]=1 [host-c]=2)
  mkdir -p "$dir/ck"
  start_coordinator "$dir"
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
  await_job "$job" "state: JOB_STATE_\(SUCCEEDED\|FAILED\|CANCELLED\)" $((steps * 3 + 600)) || true
  job_shows "$job" "state: JOB_STATE_SUCCEEDED" || fail "the $mode run did not succeed"
  [ -n "${KEEP_LOGS:-}" ] && cp -r "$dir" "$KEEP_LOGS.$mode"
  echo "$(goodput_of "$dir/watch.txt" "$steps") $(cli --output=json get "$job" | python3 -c 'import json, sys; print(len(json.load(sys.stdin).get("attempts", [])))')"
  end_round
}
lines=()
for mode in ${MODES:-clean kill9 sigterm}; do
  read -r goodput span step restarts <<<"$(run $mode)"
  echo "$mode: $restarts restarts, first to last step $span s, median step $step s, goodput $goodput"
  if [ "$mode" = clean ]; then
    bias=$goodput
  else  # the estimator's bias, which the clean run shows, divided out
    lines+=("$(awk -v g="$goodput" -v b="$bias" -v m="$mode" 'BEGIN { printf "ratio goodput_%s %.4f", m, g / b }')")
  fi
done
printf '%s\n' "${lines[@]}"
