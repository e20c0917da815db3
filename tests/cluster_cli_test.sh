#!/usr/bin/env bash
# The three binaries as a user runs them: a coordinator and two workers on loopback, the CLI
# against them, bad input refused with one clear line, and SIGTERM draining to exit 0.
# Usage: cluster_cli_test.sh <directory holding meshrun, meshrun-coordinator, meshrun-worker>
set -euo pipefail
bin=$1
source "$(dirname "$0")/cluster_lib.sh"

# Exits within `seconds` with status 0?
exits_cleanly() {
  local pid=$1 seconds=$2
  for _ in $(seq $((seconds * 10))); do
    if ! kill -0 "$pid" 2>/dev/null; then wait "$pid"; return $?; fi
    sleep 0.1
  done
  return 1
}

# --help and bad flags.
"$bin/meshrun-coordinator" --help >"$tmp/help.txt" 2>&1 || true
grep -q -- "--listen" "$tmp/help.txt" || fail "--help does not list --listen"
grep -q -- "--heartbeat_timeout" "$tmp/help.txt" || fail "--help does not list --heartbeat_timeout"
if "$bin/meshrun-coordinator" --no_such_flag >"$tmp/bad.txt" 2>&1; then fail "unknown flag accepted"; fi
grep -q "no_such_flag" "$tmp/bad.txt" || fail "unknown flag not named: $(cat "$tmp/bad.txt")"
if "$bin/meshrun-coordinator" --listen=nonsense --state_dir="$tmp/s" >"$tmp/bad.txt" 2>&1; then
  fail "bad address accepted"
fi
[ "$(wc -l <"$tmp/bad.txt")" -eq 1 ] || fail "bad address: expected one line, got: $(cat "$tmp/bad.txt")"
grep -q "HOST:PORT" "$tmp/bad.txt" || fail "bad address not explained"
touch "$tmp/file"
if "$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/file/sub" >"$tmp/bad.txt" 2>&1; then
  fail "unusable state dir accepted"
fi
grep -q "state_dir" "$tmp/bad.txt" || fail "state dir error does not name the flag"

# The cluster.
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" \
  --heartbeat_timeout=2s --drain_timeout=3s >"$tmp/coordinator.log" 2>&1 &
coordinator=$!; pids+=("$coordinator")
await_coordinator "$tmp/coordinator.log"
for w in 1 2; do
  "$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host="worker-$w" \
    --state_dir="$tmp/worker-$w" >"$tmp/worker-$w.log" 2>&1 &
  pids+=($!)
done
"$bin/meshrun" --coordinator="127.0.0.1:$port" workers --expect=2 --wait=20s >"$tmp/workers.txt" \
  || fail "workers did not register: $(cat "$tmp/workers.txt")"
grep -q "worker-1 *ALIVE" "$tmp/workers.txt" || fail "worker-1 not listed: $(cat "$tmp/workers.txt")"
grep -q "worker-2 *ALIVE" "$tmp/workers.txt" || fail "worker-2 not listed"
[ "$("$bin/meshrun" health "127.0.0.1:$port")" = "SERVING" ] || fail "coordinator not SERVING"
if "$bin/meshrun" health 127.0.0.1:1 --timeout=1s >"$tmp/health.txt" 2>&1; then fail "dead port healthy"; fi
grep -q "NOT SERVING" "$tmp/health.txt" || fail "health of a dead port: $(cat "$tmp/health.txt")"

# A port in use is refused, and the running coordinator is unharmed.
if "$bin/meshrun-coordinator" --listen="127.0.0.1:$port" --state_dir="$tmp/c2" >"$tmp/bad.txt" 2>&1; then
  fail "second coordinator on a used port started"
fi
grep -q "port already in use" "$tmp/bad.txt" || fail "port in use not explained: $(cat "$tmp/bad.txt")"
[ "$("$bin/meshrun" health "127.0.0.1:$port")" = "SERVING" ] || fail "coordinator harmed"

# SIGTERM drains every process to exit 0 within its deadline.
kill -TERM "${pids[1]}"
exits_cleanly "${pids[1]}" 5 || fail "worker-1 did not drain cleanly"
"$bin/meshrun" --coordinator="127.0.0.1:$port" workers >"$tmp/workers.txt"
grep -q "worker-1 *LEFT" "$tmp/workers.txt" || fail "drained worker not LEFT: $(cat "$tmp/workers.txt")"
kill -TERM "$coordinator"
exits_cleanly "$coordinator" 5 || fail "coordinator did not drain cleanly"
kill -TERM "${pids[2]}"
exits_cleanly "${pids[2]}" 10 || fail "worker-2 did not drain cleanly without its coordinator"
echo "cluster_cli_test: all checks passed"
