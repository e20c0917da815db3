# Shared by the multi-process shell tests; source it after setting `bin` (the binaries' folder).
# Gives a temp dir whose processes (listed in `pids`) are killed on exit, `fail` with the tail of
# every log, bounded waits, and the CLI against the coordinator on `port`.
tmp=$(mktemp -d)
pids=()
# Commands a test adds to run on exit, before its processes are killed (a test must not set its
# own EXIT trap: cleanup keeps the test's exit status).
exit_hooks=()
goodput_check="$(dirname "${BASH_SOURCE[0]}")/goodput_check.py"
# On a passing exit, every job the coordinator still knows must have a goodput that adds up to
# its wall time (tests/goodput_check.py); a coordinator the test already stopped is not asked.
check_goodput() {
  local listed
  [ -n "${port:-}" ] && listed=$(cli --output=json list 2>/dev/null) || return 0
  python3 "$goodput_check" <<<"$listed"
}
cleanup() {
  local status=$? hook p
  if [ "$status" = 0 ] && ! check_goodput; then status=1; fi
  for hook in "${exit_hooks[@]}"; do eval "$hook"; done
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
  exit "$status"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.log; do echo "--- $f"; tail -30 "$f"; done; exit 1; }
# Waits up to 30 s for pattern $2 in file $1.
wait_for() { for _ in $(seq 300); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done; return 1; }
# Sets `port` to what the coordinator logging to $1 listens on, once it does.
await_coordinator() {
  wait_for "$1" "listening on port" || fail "coordinator did not start"
  port=$(sed -n 's/.*listening on port \([0-9]*\).*/\1/p' "$1" | head -1)
}
# A free loopback port below the kernel's ephemeral range, for a server that must come back on
# the same port after a restart. Port 0 draws from that range, as do outgoing connections, so a
# concurrent test could take such a port while the server is down (CI once found another test's
# HTTP server there).
stable_port() {
  python3 - <<'EOF_PORT'
import random, socket
low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
for _ in range(200):
    port = random.randrange(max(1024, low // 2), low)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            continue
    print(port)
    break
else:
    raise SystemExit(f"no free loopback port below {low}")
EOF_PORT
}
# --data_root for a test worker (it reads a job's files only there): the temp dir (token shards,
# checkpoints, bundles a test writes) and, when `src` is set, the checkout's examples/.
worker_data_root() { echo "--data_root=$tmp${src:+,$(cd "$src" && pwd)/examples}"; }
cli() { "$bin/meshrun" --coordinator="127.0.0.1:$port" "$@"; }
# Whether job $1's manifest (`meshrun get`) matches grep pattern $2. A here-string, not a pipe:
# under pipefail, grep -q leaving at its first match SIGPIPEs the CLI and the match counts as
# a miss.
job_shows() { grep -q "$2" <<<"$(cli --output=textproto get "$1")"; }
# Polls job_shows for job $1 and pattern $2: $3 tries $4 s apart (default 0.1), then once more.
# Status 1 when it never matched.
await_job() {
  for _ in $(seq "$3"); do job_shows "$1" "$2" && return 0; sleep "${4:-0.1}"; done
  job_shows "$1" "$2"
}
# A manifest field's value from `meshrun get` output on stdin.
field() { sed -n "s/^$1: \"*\([^\"]*\)\"*$/\1/p" | head -1; }
# Writes token shards of one real text (a file of Debian's fortunes) to $tmp/shards with
# examples/make_token_shards.py; sets `text` and `python`. Needs `src`. Exits 77 (skipped) when
# the text or the project's Python is absent.
fortune_shards() {
  text=/usr/share/games/fortunes/goedel
  python="$src/.venv/bin/python"
  [ -f "$text" ] || { echo "SKIP: $text absent (scripts/setup.sh installs fortunes)"; exit 77; }
  [ -x "$python" ] || { echo "SKIP: $python absent (scripts/setup.sh)"; exit 77; }
  "$python" "$src/examples/make_token_shards.py" --source="$text" --out="$tmp/shards" \
    --shard_tokens=3000 >/dev/null || fail "the shard script failed"
}
