#!/usr/bin/env bash
# deploy/systemd units: `systemd-analyze verify` accepts them (with ExecStart pointed at the
# built binaries), each keeps its hardening and TLS lines (docs/security.md), and
# meshrun.sysusers creates their system user.
# Usage: systemd_units_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
command -v systemd-analyze >/dev/null || { echo "SKIP: systemd-analyze not installed"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for unit in "$src"/deploy/systemd/*.service; do
  name=$(basename "$unit")
  sed "s#/usr/local/bin/#$bin/#" "$unit" >"$tmp/$name"
  for line in "User=meshrun" "NoNewPrivileges=yes" "ProtectSystem=strict" \
      "ReadWritePaths=/var/lib/meshrun" "--tls_cert=" "--tls_key=" "--tls_ca="; do
    grep -q -- "$line" "$unit" || { echo "FAIL: $name lacks $line"; exit 1; }
  done
done
if ! systemd-analyze verify "$tmp"/*.service >"$tmp/verify.txt" 2>&1; then
  echo "FAIL: systemd-analyze verify:"; cat "$tmp/verify.txt"; exit 1
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
echo PASS
