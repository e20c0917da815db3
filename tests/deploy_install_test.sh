#!/usr/bin/env bash
# The deploy kit (docs/deploy.md): `cmake --install` of this build into a temp prefix, the
# installed coordinator started from there (gRPC health SERVING, the dashboard served from
# <prefix>/share/meshrun/web), and the installed systemd units checked by
# `systemd-analyze verify` (their ExecStart pointed at the prefix). The units' check exits 77
# (skipped) only when systemd-analyze is absent.
# Usage: deploy_install_test.sh <build directory> <source directory>
set -euo pipefail
build=$1
src=$2
bin=unused
source "$src/tests/cluster_lib.sh"
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 || fail "cmake --install failed"
for f in bin/meshrun bin/meshrun-coordinator bin/meshrun-worker \
         lib/systemd/system/meshrun-coordinator.service lib/systemd/system/meshrun-worker.service \
         lib/sysusers.d/meshrun.conf; do
  [ -e "$prefix/$f" ] || fail "not installed: $f"
done
"$prefix/bin/meshrun-coordinator" --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 --pjrt_plugin= \
  --state_dir="$tmp/state" >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
"$prefix/bin/meshrun" health "127.0.0.1:$port" >"$tmp/health.txt" 2>&1 \
  || fail "installed coordinator not healthy: $(cat "$tmp/health.txt")"
grep -q SERVING "$tmp/health.txt" || fail "health: $(cat "$tmp/health.txt")"
http_port=$(sed -n 's/.*HTTP on port \([0-9]*\).*/\1/p' "$tmp/coordinator.log" | head -1)
if [ -f "$build/web/index.html" ]; then
  [ -f "$prefix/share/meshrun/web/index.html" ] || fail "dashboard not installed"
  curl -fsS "http://127.0.0.1:$http_port/" >"$tmp/index.html" || fail "installed dashboard not served"
  cmp -s "$tmp/index.html" "$prefix/share/meshrun/web/index.html" || fail "/ is not the installed index.html"
fi
echo "installed coordinator: $(cat "$tmp/health.txt")"

command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze absent (apt-get install systemd)"; exit 77; }
mkdir -p "$tmp/units"
for unit in meshrun-coordinator.service meshrun-worker.service; do
  sed "s#/usr/local/bin/#$prefix/bin/#g" "$prefix/lib/systemd/system/$unit" >"$tmp/units/$unit"
done
SYSTEMD_LOG_LEVEL=warning systemd-analyze verify --man=no "$tmp/units/"*.service \
  >"$tmp/verify.txt" 2>&1 || fail "systemd-analyze verify: $(cat "$tmp/verify.txt")"
[ ! -s "$tmp/verify.txt" ] || fail "systemd-analyze verify warns: $(cat "$tmp/verify.txt")"
echo "deploy_install_test: all checks passed"
