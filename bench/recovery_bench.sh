#!/usr/bin/env bash
# Recovery time after a lost host (docs/checkpoints.md, "Memory tier"), through the real
# binaries on loopback: transformer_lm/dp4x2 on two host replicas of 4 CPU devices, disk
# checkpoints every 50 steps, host-b killed (-9) after step 73.
#   memory: in-memory checkpoints every 10 steps (the default) and a spare (host-c, --spare);
#           the job restarts at once on host-a and host-c from the in-memory step 70.
#   cold:   no in-memory checkpoints, no spare, host-b started again 1 s after the kill (the
#           way recovery was measured before the memory tier); it restarts from disk step 50.
# Per round: seconds from the kill to the next run's first completed step, and to the next
# completed step that is new (the one after the newest the job completed before the kill, as
# `meshrun watch` showed it: the job makes progress again), and when the coordinator's log says the
# failure was reported, the job RESTARTING and ASSIGNED. Then the medians and
#   ratio recovery_vs_cold_restart <median cold / median memory seconds to the next new step>
# Usage: bash bench/recovery_bench.sh <directory of the binaries> <source directory> [rounds]
set -euo pipefail
bin=$1
src=$2
rounds=${3:-3}
source "$src/bench/cluster_rounds_lib.sh"
now() { date +%s.%N; }
# Seconds since the kill at which the coordinator's log (UTC "<date>THH:MM:SS.mmmZ") last said $2.
logged_at() {
  local at
  at=$(grep "$2" "$1/c.log" | tail -1 | sed -n 's/^[0-9-]*T\([0-9:.]*\)Z.*/\1/p')
  [ -n "$at" ] || { echo "-"; return; }
  awk -v t="$at" -v k="$kill_clock" 'BEGIN { split(t, a, ":"); printf "%.2f", a[1] * 3600 + a[2] * 60 + a[3] - k }'
}
# One round of mode $1; prints "<first step s> <next new step s> <where it went>".
round() {
  local mode=$1 dir="$tmp/r$RANDOM" flags="" job victim
  declare -A pid_of
  mkdir -p "$dir/ck"
  start_coordinator "$dir"
  pid_of[host-a]=$(start_worker "$dir" host-a 0)
  pid_of[host-b]=$(start_worker "$dir" host-b 1)
  cli workers --expect=2 --wait=30s >/dev/null || fail "workers did not register"
  if [ "$mode" = memory ]; then
    pid_of[host-c]=$(start_worker "$dir" host-c 2 --spare)
    cli workers --expect=3 --wait=30s >/dev/null || fail "the spare did not register"
  else
    flags=--memory_checkpoint_every=0
  fi
  # shellcheck disable=SC2086  # flags is one flag or none
  job=$(cli submit "$lm" --data=synthetic --steps=150 --cadence=1 --checkpoint_dir="$dir/ck" \
    --checkpoint_every=50 $flags)
  cli watch "$job" --since_step=1 >"$dir/watch.txt" 2>&1 &
  track $!
  wait_for "$dir/watch.txt" "^ *73 " || fail "no step 73"
  # The job's second replica is the one to lose.
  victim=$(cli --output=textproto get "$job" | sed -n 's/^ *replica_hosts: "\(.*\)"/\1/p' | tail -1)
  local t0 first new reached
  t0=$(now)
  kill_clock=$(date -u +%H:%M:%S.%N | awk -F: '{ printf "%.3f", $1 * 3600 + $2 * 60 + $3 }')
  kill -9 "${pid_of[$victim]}"
  if [ "$mode" = cold ]; then
    sleep 1
    start_worker "$dir" "$victim" 1 >/dev/null
  fi
  first=""
  for _ in $(seq 1200); do
    if [ -z "$first" ] && grep -A1 "^-- run 2" "$dir/watch.txt" | grep -q "^ *[0-9]"; then
      first=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
      # The newest step the job completed (its summary combined) before the restart; a host
      # may have finished one more alone, which the job never had.
      reached=$(sed '/^-- run 2/q' "$dir/watch.txt" | awk '$1 ~ /^[0-9]+$/ { s = $1 } END { print s }')
    fi
    if [ -n "$first" ] && grep -A200 "^-- run 2" "$dir/watch.txt" | grep -q "^ *$((reached + 1)) "; then
      new=$(awk -v a="$t0" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }')
      break
    fi
    sleep 0.05
  done
  [ -n "${new:-}" ] || fail "the $mode round did not recover: $(tail -3 "$dir/watch.txt")"
  echo "$first $new failure reported $(logged_at "$dir" "reports FAILED"), RESTARTING $(logged_at "$dir" "RESTARTING"), ASSIGNED $(logged_at "$dir" "ASSIGNED")"
  [ -n "${KEEP_LOGS:-}" ] && cp -r "$dir" "$KEEP_LOGS.$mode"
  cli cancel "$job" >/dev/null 2>&1 || true
  end_round
}
declare -A firsts news
for mode in memory cold; do
  for r in $(seq "$rounds"); do
    read -r first new where <<<"$(round $mode)"
    echo "$mode round $r: ${first} s to the first step after the kill, ${new} s to the next new step; since the kill: $where"
    firsts[$mode]+="$first "
    news[$mode]+="$new "
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{ t[NR] = $1 } END { print NR % 2 ? t[(NR + 1) / 2] : (t[NR / 2] + t[NR / 2 + 1]) / 2 }'; }
echo "median first step after the kill: memory tier with a spare $(median <<<"${firsts[memory]}") s, cold restart from disk $(median <<<"${firsts[cold]}") s"
m=$(median <<<"${news[memory]}")
c=$(median <<<"${news[cold]}")
echo "median next new step after the kill: memory tier with a spare ${m} s, cold restart from disk ${c} s"
awk -v m="$m" -v c="$c" 'BEGIN { printf "ratio recovery_vs_cold_restart %.2f\n", c / m }'
