#!/usr/bin/env bash
# The workers at fleet scale, through the coordinator's HTTP API, the CLI and the dashboard in
# headless Chromium. A coordinator holds 5 hosts over 2 slices, registered by hand over gRPC
# (no worker processes: their addresses are closed ports on loopback):
#   1. /api/workers pages (page_size, page_token), filters (state, slice) and refuses a bad
#      token or state with a 400 naming it;
#   2. `meshrun workers` filters by slice and prints the next page's --page_token;
#   3. the dashboard opened with #workers_page=2 (dashboard_workers.mjs): the slice summary
#      counts every host, the pager walks the pages, and device memory is asked only for the
#      hosts a page lists.
# Usage: dashboard_workers_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
source "$(dirname "$0")/cluster_lib.sh"
python="$src/.venv/bin/python"
[ -x "$python" ] || { echo "SKIP: $python absent (scripts/setup.sh)"; exit 77; }
[ -d "$src/web/node_modules/playwright-core" ] || fail "playwright-core missing (run scripts/setup.sh)"

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --http_listen=127.0.0.1:0 \
  --heartbeat_timeout=300s --state_dir="$tmp/coordinator" >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
http=$(sed -n 's/.*HTTP on port \([0-9]*\).*/\1/p' "$tmp/coordinator.log" | head -1)
[ -n "$http" ] || fail "no HTTP port logged"
base="http://127.0.0.1:$http"

"$python" - "127.0.0.1:$port" <<'PY' || fail "registering the hosts"
import sys
import grpc
from meshrun.v1 import common_pb2, coordinator_pb2 as cpb, coordinator_pb2_grpc as cgrpc
stub = cgrpc.CoordinatorStub(grpc.insecure_channel(sys.argv[1]))
for i, slice_id in enumerate([0, 0, 0, 1, 1]):
    stub.RegisterWorker(cpb.RegisterWorkerRequest(registration=cpb.WorkerRegistration(
        protocol=common_pb2.ProtocolVersion(version=1), host=f"host-{i}",
        address=f"127.0.0.1:{9 + i}", slice_id=slice_id, num_slices=2, worker_index=i,
        incarnation=f"incarnation-{i}")), timeout=10)
PY

# 1. The HTTP API.
api() { curl -s -o "$tmp/body" -w '%{http_code}' "$base/api/workers$1"; }
hosts() { "$python" -c 'import json, sys; print(" ".join(w["registration"]["host"] for w in json.load(open(sys.argv[1]))["workers"]))' "$tmp/body"; }
key() { "$python" -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$tmp/body" "$1"; }
[ "$(api '?page_size=2')" = 200 ] || fail "first page: $(cat "$tmp/body")"
[ "$(hosts)" = "host-0 host-1" ] || fail "first page lists $(hosts)"
[ "$(key total_matches)" = 5 ] || fail "total_matches $(key total_matches)"
token=$(key next_page_token)
[ "$(api "?page_size=2&page_token=$token")" = 200 ] || fail "second page: $(cat "$tmp/body")"
[ "$(hosts)" = "host-2 host-3" ] || fail "second page lists $(hosts)"
[ "$(api '?slice=1')" = 200 ] && [ "$(hosts)" = "host-3 host-4" ] || fail "slice 1: $(cat "$tmp/body")"
[ "$(key next_page_token)" = "" ] || fail "one page has a next page"
[ "$(api '?state=dead')" = 200 ] && [ "$(hosts)" = "" ] || fail "dead: $(cat "$tmp/body")"
[ "$(api '?page_token=nonsense')" = 400 ] && grep -q page_token "$tmp/body" \
  || fail "a bad page_token: $(cat "$tmp/body")"
[ "$(api '?state=sleepy')" = 400 ] && grep -q state "$tmp/body" || fail "a bad state: $(cat "$tmp/body")"

# 2. The CLI.
listed=$(cli --output=json workers --slice=1)
[ "$(python3 -c 'import json, sys; print(len(json.loads(sys.stdin.read())["workers"]))' <<<"$listed")" = 2 ] \
  || fail "meshrun workers --slice=1: $listed"
page=$(cli workers --page_size=2)
grep -q "2 of 5 listed; the next page: --page_token=0/host-1" <<<"$page" || fail "meshrun workers --page_size=2: $page"
grep -Eq "^1 +2 +0 +0 +0$" <<<"$page" || fail "no slice summary: $page"
cli workers --state=sleepy >/dev/null 2>"$tmp/cli.err" && fail "--state=sleepy accepted"
grep -q "is not alive, dead or left" "$tmp/cli.err" || fail "--state=sleepy: $(cat "$tmp/cli.err")"

# 3. The dashboard.
node "$src/tests/dashboard_workers.mjs" "$src/web" "$base/#workers_page=2" || fail "browser test"
