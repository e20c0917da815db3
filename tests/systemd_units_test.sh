#!/usr/bin/env bash
# deploy/systemd units: `systemd-analyze verify` accepts them (with ExecStart pointed at the
# built binaries), each keeps its hardening and TLS lines (docs/security.md), meshrun.sysusers
# creates their system user, and:
#   - `systemd-analyze security --offline=true` rates each unit 2.5 or less (and a unit without
#     the hardening lines above that, so the check can fail);
#   - the binaries run a job under each unit's sandbox: its system call filter, address
#     families, namespace, realtime and personality restrictions, empty capability bounding set,
#     no-new-privileges, umask, /proc options and (coordinator) private /dev, applied by
#     tests/unit_sandbox.py, as an unprivileged user. systemd-run cannot do it here (it needs
#     systemd as PID 1; CI containers lack it), so that script applies the unit's settings
#     itself; it needs root (mount namespace) and is skipped, saying so, without it.
# Usage: systemd_units_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not installed"; exit 77; }
source "$(dirname "$0")/cluster_lib.sh"
for unit in "$src"/deploy/systemd/*.service; do
  name=$(basename "$unit")
  sed "s#/usr/local/bin/#$bin/#" "$unit" >"$tmp/$name"
  for line in "User=meshrun" "NoNewPrivileges=yes" "ProtectSystem=strict" \
      "ReadWritePaths=/var/lib/meshrun" "UMask=0077" "SystemCallFilter=@system-service" \
      "SystemCallArchitectures=native" "--tls_cert=" "--tls_key=" "--tls_ca="; do
    grep -q -- "$line" "$unit" || { echo "FAIL: $name lacks $line"; exit 1; }
  done
done
if ! systemd-analyze verify "$tmp"/*.service >"$tmp/verify.txt" 2>&1; then
  echo "FAIL: systemd-analyze verify:"; cat "$tmp/verify.txt"; exit 1
fi
# Exposure scores (issue 27, item 17): each unit 2.5 or less. --threshold= is the score times 10.
# --offline=true (systemd 250+) rates the file itself, with no running systemd.
max_exposure=25
exposure() { sed -n 's/.*Overall exposure level for .*: \([0-9.]*\) .*/\1/p' "$1"; }
for unit in "$tmp"/meshrun-*.service; do
  name=$(basename "$unit")
  status=0
  systemd-analyze security --offline=true --threshold=$max_exposure "$unit" >"$tmp/$name.security" 2>&1 \
    || status=$?
  score=$(exposure "$tmp/$name.security")
  [ -n "$score" ] || { echo "FAIL: no exposure level for $name:"; cat "$tmp/$name.security"; exit 1; }
  [ "$status" -eq 0 ] || { echo "FAIL: $name exposure $score, above 2.5:"; grep '✗' "$tmp/$name.security"; exit 1; }
  echo "$name: exposure $score (at most 2.5)"
done
# The check can fail: the coordinator's unit without its hardening lines rates above 2.5.
sed '/^# Hardening/,/^\[Install\]/{/^User=\|^Group=\|^\[Install\]/!d}' \
  "$tmp/meshrun-coordinator.service" >"$tmp/bare.service"
if systemd-analyze security --offline=true --threshold=$max_exposure "$tmp/bare.service" \
    >"$tmp/bare.security" 2>&1; then
  echo "FAIL: a unit without hardening passed the threshold: $(exposure "$tmp/bare.security")"; exit 1
fi
# The units' user: deploy/systemd/meshrun.sysusers creates it (into a scratch root), unprivileged,
# at home in the state directory, with no login shell.
if command -v systemd-sysusers >/dev/null; then
  mkdir -p "$tmp/root/etc"
  systemd-sysusers --root="$tmp/root" "$src/deploy/systemd/meshrun.sysusers" >"$tmp/sysusers.txt" 2>&1 \
    || { echo "FAIL: systemd-sysusers: $(cat "$tmp/sysusers.txt")"; exit 1; }
  IFS=: read -r _ _ uid gid _ home shell < <(grep '^meshrun:' "$tmp/root/etc/passwd") \
    || { echo "FAIL: no meshrun user: $(cat "$tmp/root/etc/passwd")"; exit 1; }
  [ "$uid" -gt 0 ] && [ "$uid" -lt 1000 ] && [ "$home" = /var/lib/meshrun ] && [ "$shell" = /usr/sbin/nologin ] \
    || { echo "FAIL: meshrun user is uid $uid, home $home, shell $shell"; exit 1; }
  grep -q "^meshrun:x:$gid:" "$tmp/root/etc/group" || { echo "FAIL: no meshrun group $gid"; exit 1; }
fi
# verify must be able to fail: a unit with an unknown setting is refused... or at least reported.
printf '[Service]\nExecStart=%s/meshrun-worker\nProtectSystem=bogus\n' "$bin" >"$tmp/bad.service"
systemd-analyze verify "$tmp/bad.service" >"$tmp/bad.txt" 2>&1 || true
grep -qi "bogus\|failed to parse" "$tmp/bad.txt" || { echo "FAIL: verify did not report a bad unit"; cat "$tmp/bad.txt"; exit 1; }

# The binaries under each unit's sandbox: a coordinator and a worker (user nobody) run a job.
sandbox_skip() { echo "SKIP (sandbox run only; the checks above passed): $*"; echo PASS; exit 0; }
[ "$(id -u)" -eq 0 ] || sandbox_skip "needs root for a mount namespace and a change of user"
for tool in unshare mount python3; do
  command -v "$tool" >/dev/null || sandbox_skip "$tool not installed"
done
python3 -c 'import ctypes.util, sys; sys.exit(ctypes.util.find_library("seccomp") is None)' \
  || sandbox_skip "libseccomp not installed"
pid1=$(cat /proc/1/comm 2>/dev/null || echo unknown)
echo "sandbox: PID 1 is $pid1; tests/unit_sandbox.py applies the units' settings (not systemd-run)"
nobody=$(id -u nobody) && nogroup=$(id -g nobody) || sandbox_skip "no user nobody"
# sandboxed --unit=<unit file> -- <command...>: the command keeps the PID `&` gives.
sandboxed=(python3 "$src/tests/unit_sandbox.py" --uid="$nobody" --gid="$nogroup")
chmod 0755 "$tmp"
install -d -m 0700 -o "$nobody" -g "$nogroup" "$tmp/state"
# The filter is on: the coordinator may not pin CPUs (@resources) and neither unit may make
# namespaces; the same commands work for user nobody outside the sandbox.
setpriv --reuid="$nobody" --regid="$nogroup" --clear-groups taskset -c 0 true \
  || fail "taskset fails even unsandboxed"
if "${sandboxed[@]}" --unit="$tmp/meshrun-coordinator.service" -- taskset -c 0 true 2>/dev/null; then
  fail "the coordinator's sandbox let sched_setaffinity through"
fi
for unit in coordinator worker; do
  if "${sandboxed[@]}" --unit="$tmp/meshrun-$unit.service" -- unshare --user true 2>/dev/null; then
    fail "the $unit's sandbox let a namespace be made"
  fi
done
"${sandboxed[@]}" --unit="$tmp/meshrun-coordinator.service" -- "$bin/meshrun-coordinator" --listen=127.0.0.1:0 \
  --http_listen=127.0.0.1:0 --state_dir="$tmp/state/coordinator" >"$tmp/coordinator.log" 2>&1 &
pids+=($!); coordinator=$!
await_coordinator "$tmp/coordinator.log"
"${sandboxed[@]}" --unit="$tmp/meshrun-worker.service" -- "$bin/meshrun-worker" --listen=127.0.0.1:0 \
  --coordinator="127.0.0.1:$port" --host=sandboxed-0 --state_dir="$tmp/state/worker" \
  --data_root="$src/examples" >"$tmp/worker.log" 2>&1 &
pids+=($!); worker=$!
cli workers --expect=1 --wait=60s >/dev/null || fail "the sandboxed worker did not register"
cli submit "$src/examples/mlp_classifier/dp8/job.json" --steps=20 --cadence=10 --follow \
  --output=textproto --wait=120s >"$tmp/job.txt" || fail "the job failed under the sandbox: $(cat "$tmp/job.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job.txt" || fail "job state: $(cat "$tmp/job.txt")"
for p in "$worker" "$coordinator"; do
  kill -TERM "$p"
  status=0; wait "$p" || status=$?
  [ "$status" -eq 0 ] || fail "a sandboxed server exited $status on SIGTERM"
done
echo "sandbox: coordinator and worker ran a job under their units' settings"
# Why the units leave MemoryDenyWriteExecute= off: with it, XLA's CPU plugin cannot compile
# (its JIT makes written pages executable). Should this start to pass, turn the setting on.
sed 's/^# MemoryDenyWriteExecute=.*/MemoryDenyWriteExecute=yes/' "$tmp/meshrun-coordinator.service" \
  >"$tmp/wx.service"
grep -q '^MemoryDenyWriteExecute=yes' "$tmp/wx.service" || fail "no MemoryDenyWriteExecute comment to turn on"
"${sandboxed[@]}" --unit="$tmp/wx.service" -- "$bin/meshrun-coordinator" --listen=127.0.0.1:0 \
  --state_dir="$tmp/state/wx-coordinator" >"$tmp/wx-coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/wx-coordinator.log"
"${sandboxed[@]}" --unit="$tmp/meshrun-worker.service" -- "$bin/meshrun-worker" --listen=127.0.0.1:0 \
  --coordinator="127.0.0.1:$port" --host=sandboxed-1 --state_dir="$tmp/state/wx-worker" \
  --data_root="$src/examples" >"$tmp/wx-worker.log" 2>&1 &
pids+=($!)
cli workers --expect=1 --wait=60s >/dev/null || fail "the second sandboxed worker did not register"
if cli submit "$src/examples/mlp_classifier/dp8/job.json" --steps=20 --follow --wait=120s \
    >"$tmp/wx-job.txt" 2>&1; then
  fail "a job compiled under MemoryDenyWriteExecute=yes: turn it on in the units"
fi
grep -q "LLVM compilation error: Operation not permitted" "$tmp/wx-coordinator.log" \
  || fail "the job under MemoryDenyWriteExecute=yes failed for another reason: $(cat "$tmp/wx-job.txt")"
echo "sandbox: with MemoryDenyWriteExecute=yes the coordinator cannot compile (so the units leave it off)"
echo PASS
