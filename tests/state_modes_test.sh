#!/usr/bin/env bash
# File modes (issue 27, item 16): a coordinator and a worker started from a shell whose umask is
# 022 run a job that checkpoints; then every directory under their state directories, and under
# the checkpoint they wrote, is 0700 and every file 0600 (the binaries narrow their own umask,
# rpc/binary_setup.h). The worker's state directory already exists 0755 with a 0644 file in it,
# as an older meshrun left it: it is narrowed at start-up, with a warning naming it.
# Usage: state_modes_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/mlp_classifier/dp8/job.json"
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$bundle" ] || fail "bundle $bundle missing"
umask 022

mkdir -p "$tmp/worker/executables" "$tmp/checkpoints"
echo old >"$tmp/worker/executables/left-by-an-older-version"
chmod 0755 "$tmp/worker" "$tmp/worker/executables"
chmod 0644 "$tmp/worker/executables/left-by-an-older-version"

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" --data_root="$tmp" \
  >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" \
  --host=modes-0 --state_dir="$tmp/worker" >"$tmp/worker.log" 2>&1 &
pids+=($!)
cli workers --expect=1 --wait=60s >/dev/null || fail "the worker did not register"
grep -q "state_dir=$tmp/worker was open to other users (mode 755)" "$tmp/worker.log" \
  || fail "no warning about the open state directory"

cli submit "$bundle" --steps=4 --cadence=2 --checkpoint_dir="$tmp/checkpoints" --checkpoint_every=2 \
  --follow --output=textproto --wait=120s >"$tmp/job.txt" || fail "the job failed: $(cat "$tmp/job.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job.txt" || fail "job state: $(cat "$tmp/job.txt")"

# What the servers wrote: state (telemetry database, executable cache and store, programs) and
# the checkpoint's contents (the checkpoint directory itself is the caller's, made 0755 above).
[ -n "$(find "$tmp/checkpoints" -mindepth 1 -type f)" ] || fail "no checkpoint written"
[ -e "$tmp/coordinator/telemetry.db" ] || fail "no telemetry database"
[ -n "$(find "$tmp/worker/executables" -type f ! -name 'left-*')" ] || fail "the worker stored no executable"
open=$( (find "$tmp/coordinator" "$tmp/worker" -type d ! -perm 0700
         find "$tmp/checkpoints" -mindepth 1 -type d ! -perm 0700
         find "$tmp/coordinator" "$tmp/worker" "$tmp/checkpoints" -type f ! -perm 0600) \
        | while read -r path; do stat -c '%a %n' "$path"; done)
[ -z "$open" ] || fail "not private to the servers' user:
$open"
echo "checked $(find "$tmp/coordinator" "$tmp/worker" "$tmp/checkpoints" -mindepth 1 | wc -l) entries"
echo PASS
