#!/usr/bin/env bash
# A secured cluster with the real binaries on loopback, set up as docs/security.md says:
# `meshrun certs` makes the CA, the coordinator's and workers' certificates and two tokens;
# every link is mutual TLS and the CLI authenticates with bearer tokens.
#   1. plaintext on a non-loopback address is refused without --insecure, and flagged with it,
#      the coordinator's and each worker's (meshrun workers, its JSON, /metrics);
#   2. a worker whose certificate names another host is refused; callers without a token, or
#      with a role too small, get UNAUTHENTICATED / PERMISSION_DENIED naming the role;
#   3. the main job path (submit, distribute, train, watch, export) succeeds over mTLS;
#   4. every HTTP path (the page, a static asset, /metrics, /api/*, /login, /logout) against
#      plain http://, no identity, an unknown token, each role's token and certificate, a worker's
#      and the coordinator's certificate, an untrusted and an expired one; the login cookie;
#      the coordinator's certificate reissued while it runs is served at the next handshake;
#   5. clients check who answers: a server with a worker's certificate posing as the
#      coordinator is refused by the CLI and the Python SDK, naming both identities.
# Usage: secure_cluster_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/mlp_classifier/dp8/job.json"
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$bundle" ] || fail "bundle $bundle missing"

# 1. Secure by default.
if "$bin/meshrun-coordinator" --listen=0.0.0.0:0 --state_dir="$tmp/c0" >"$tmp/plain.txt" 2>&1; then
  fail "plaintext 0.0.0.0 accepted"
fi
grep -q -- "--insecure" "$tmp/plain.txt" || fail "plaintext refusal: $(cat "$tmp/plain.txt")"
"$bin/meshrun-coordinator" --listen=0.0.0.0:0 --insecure --state_dir="$tmp/c1" \
  --http_listen=127.0.0.1:0 >"$tmp/insecure.log" 2>&1 &
insecure=$!; pids+=($insecure)
wait_for "$tmp/insecure.log" "PLAINTEXT" || fail "--insecure gave no warning"
wait_for "$tmp/insecure.log" "HTTP on port" || fail "no HTTP port"
http=$(sed -n "s/.*HTTP on port \([0-9]*\).*/\1/p" "$tmp/insecure.log" | head -1)
plain=$(sed -n "s/.*listening on port \([0-9]*\).*/\1/p" "$tmp/insecure.log" | head -1)
grep -q "^meshrun_insecure_plaintext 1" <<<"$(curl -sf "http://127.0.0.1:$http/metrics")" || fail "/metrics does not flag --insecure"
grep -q PLAINTEXT <<<"$("$bin/meshrun" --coordinator="127.0.0.1:$plain" workers)" || fail "workers does not flag --insecure"
# A worker serving plaintext beyond loopback is flagged too, per host; one on loopback is not.
"$bin/meshrun-worker" --listen=0.0.0.0:0 --insecure --coordinator="127.0.0.1:$plain" --host=open-0 \
  --state_dir="$tmp/open-0" >"$tmp/open-0.log" 2>&1 &
open_worker=$!; pids+=($open_worker)
"$bin/meshrun-worker" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$plain" --host=local-0 \
  --state_dir="$tmp/local-0" >"$tmp/local-0.log" 2>&1 &
local_worker=$!; pids+=($local_worker)
"$bin/meshrun" --coordinator="127.0.0.1:$plain" workers --expect=2 --wait=60s >"$tmp/open.txt" \
  || fail "insecure workers did not register: $(cat "$tmp/open.txt")"
grep "^open-0 " "$tmp/open.txt" | grep -q "PLAINTEXT beyond loopback (--insecure)" \
  || fail "workers does not flag the --insecure worker: $(cat "$tmp/open.txt")"
grep "^local-0 " "$tmp/open.txt" | grep -q PLAINTEXT && fail "a loopback worker is flagged"
"$bin/meshrun" --coordinator="127.0.0.1:$plain" --output=json workers 2>/dev/null >"$tmp/open.json"
python3 - "$tmp/open.json" <<'PY' || fail "workers --output=json: $(cat "$tmp/open.json")"
import json, sys
workers = {w["registration"]["host"]: w["registration"] for w in json.load(open(sys.argv[1]))["workers"]}
assert workers["open-0"].get("insecure") is True, workers["open-0"]
assert not workers["local-0"].get("insecure", False), workers["local-0"]
PY
curl -sf "http://127.0.0.1:$http/metrics" >"$tmp/open.metrics"
grep -q '^meshrun_worker_insecure_plaintext{host="open-0"} 1$' "$tmp/open.metrics" \
  && grep -q '^meshrun_worker_insecure_plaintext{host="local-0"} 0$' "$tmp/open.metrics" \
  || fail "/metrics: $(grep worker_insecure "$tmp/open.metrics")"
kill $open_worker $local_worker $insecure

# Certificates and tokens.
ca="$tmp/ca"
"$bin/meshrun" certs init --dir="$ca" --cluster=test >/dev/null || fail "certs init"
"$bin/meshrun" certs issue --dir="$ca" --role=coordinator --name=coordinator >/dev/null || fail "issue"
for w in worker-0 worker-1 worker-2 worker-3; do
  "$bin/meshrun" certs issue --dir="$ca" --role=worker --name=$w >/dev/null || fail "issue $w"
done
submit_token=$("$bin/meshrun" certs token --role=submit --name=ci --tokens_file="$ca/tokens")
view_token=$("$bin/meshrun" certs token --role=view --name=grafana --tokens_file="$ca/tokens")
[ "$(wc -l <"$ca/tokens")" -eq 2 ] || fail "tokens file: $(cat "$ca/tokens")"
grep -q "$submit_token" "$ca/tokens" && fail "the tokens file holds a token, not its hash"
tls() { echo --tls_cert="$ca/$1.pem" --tls_key="$ca/$1.key" --tls_ca="$ca/ca.pem"; }

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" $(tls coordinator) \
  --auth_tokens_file="$ca/tokens" --http_listen=127.0.0.1:0 >"$tmp/coordinator.log" 2>&1 &
coordinator_pid=$!; pids+=($coordinator_pid)
await_coordinator "$tmp/coordinator.log"
for w in 0 1; do
  "$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host="worker-$w" \
    --worker_index=$w $(tls worker-$w) --state_dir="$tmp/worker-$w" >"$tmp/worker-$w.log" 2>&1 &
  pids+=($!)
done
# 2. worker-0's certificate cannot register as another host.
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=intruder \
  $(tls worker-0) --state_dir="$tmp/intruder" >"$tmp/intruder.log" 2>&1 &
pids+=($!)
scli() { "$bin/meshrun" --coordinator="127.0.0.1:$port" --tls_ca="$ca/ca.pem" "$@"; }
MESHRUN_TOKEN=$view_token scli workers --expect=2 --wait=30s >"$tmp/workers.txt" \
  || fail "workers did not register: $(cat "$tmp/workers.txt")"
wait_for "$tmp/intruder.log" "PERMISSION_DENIED" || fail "intruder not refused"
grep -q 'names host "worker-0"' "$tmp/intruder.log" || fail "intruder refusal unclear"
grep -q intruder "$tmp/workers.txt" && fail "intruder registered"
grep -q "refused .*RegisterWorker\|tried to act as host" "$tmp/coordinator.log" || fail "refusal not logged"

if scli list >"$tmp/bad.txt" 2>&1; then fail "list without a token succeeded"; fi
grep -q UNAUTHENTICATED "$tmp/bad.txt" || fail "no-token error: $(cat "$tmp/bad.txt")"
if "$bin/meshrun" --coordinator="127.0.0.1:$port" list >"$tmp/bad.txt" 2>&1; then
  fail "plaintext client reached a TLS coordinator"
fi
if scli --token="$view_token" submit "$bundle" --steps=4 >"$tmp/bad.txt" 2>&1; then
  fail "view token submitted a job"
fi
grep -q "PERMISSION_DENIED" "$tmp/bad.txt" && grep -q "needs role submit" "$tmp/bad.txt" \
  || fail "view submit error: $(cat "$tmp/bad.txt")"

# 3. The main job path over mTLS.
echo "$submit_token" >"$tmp/submit.token"
scli --token_file="$tmp/submit.token" submit "$bundle" --steps=20 --cadence=5 --follow --output=textproto \
  --wait=300s >"$tmp/job.txt" || fail "job did not succeed: $(cat "$tmp/job.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job.txt" || fail "job state: $(cat "$tmp/job.txt")"
job=$(field job_id <"$tmp/job.txt")
sent=$(field executable_bytes_sent <"$tmp/job.txt")
[ -n "$sent" ] && [ "$sent" -gt 0 ] || fail "no executable bytes distributed"
export MESHRUN_TOKEN=$view_token
scli watch "$job" --since_step=1 >"$tmp/watch.txt" || fail "watch: $(cat "$tmp/watch.txt")"
[ "$(awk '$1 ~ /^[0-9]+$/' "$tmp/watch.txt" | wc -l)" -eq 4 ] || fail "watch rows: $(cat "$tmp/watch.txt")"
scli export "$job" --format=jsonl --out="$tmp/history.jsonl" 2>/dev/null || fail "export"
[ "$(wc -l <"$tmp/history.jsonl")" -eq 4 ] || fail "export lines: $(wc -l <"$tmp/history.jsonl")"
if scli cancel "$job" >"$tmp/bad.txt" 2>&1; then fail "view token cancelled a job"; fi
[ "$(scli health "127.0.0.1:$port")" = "SERVING" ] || fail "health over TLS"
# Host replicas on two 4-device workers: gloo's rendezvous through the key-value store works
# for the job's own members (collectives/<job>/ keys, checked for membership).
for w in 2 3; do
  "$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host="worker-$w" \
    --worker_index=$w --cpu_devices=4 $(tls worker-$w) --state_dir="$tmp/worker-$w" \
    >"$tmp/worker-$w.log" 2>&1 &
  pids+=($!)
done
worker3_pid=${pids[-1]}
MESHRUN_TOKEN=$view_token scli workers --expect=4 --wait=30s >/dev/null || fail "4 workers"
scli --token_file="$tmp/submit.token" submit "$src/examples/transformer_lm/dp4x2/job.json" \
  --host_replicas=2 --steps=3 --cadence=1 --follow --output=textproto --wait=300s >"$tmp/replicas.txt" \
  || fail "host-replica job: $(cat "$tmp/replicas.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/replicas.txt" || fail "replicas: $(cat "$tmp/replicas.txt")"
if grep "refused" "$tmp/coordinator.log" | grep -q "collectives/"; then fail "a member's key refused"; fi

# 4. Every HTTP endpoint against every kind of caller, each cell the status it must get.
http=$(sed -n "s/.*HTTP on port \([0-9]*\).*/\1/p" "$tmp/coordinator.log" | head -1)
admin_token=$("$bin/meshrun" certs token --role=admin --name=ops --tokens_file="$ca/tokens")
scrape_token=$("$bin/meshrun" certs token --role=metrics --name=prometheus --tokens_file="$ca/tokens")
for r in view:dash submit:sub admin:adm; do
  "$bin/meshrun" certs issue --dir="$ca" --role=client --roles="${r%%:*}" --name="${r#*:}" >/dev/null \
    || fail "issue ${r#*:}"
done
"$bin/meshrun" certs issue --dir="$ca" --role=client --roles=admin --name=old --days=-1 >/dev/null \
  || fail "issue an expired certificate"
"$bin/meshrun" certs init --dir="$tmp/other-ca" --cluster=test >/dev/null || fail "other CA"
"$bin/meshrun" certs issue --dir="$tmp/other-ca" --role=client --roles=admin --name=eve >/dev/null \
  || fail "issue eve"
sleep 1.2  # the tokens file is rechecked once a second
# HTTPS with the coordinator's certificate (its DNS SAN is "coordinator"), checked against the CA.
code() { curl -s -o /dev/null -w '%{http_code}' --max-time 3 --cacert "$ca/ca.pem" \
  --resolve "coordinator:$http:127.0.0.1" "$@"; }
cell() {  # cell <expected status> <path> <caller> [curl arguments]
  local want=$1 path=$2 who=$3 got; shift 3
  got=$(code "${method[@]}" "$@" "https://coordinator:$http$path") || true  # curl fails on 000
  [ "$got" = "$want" ] || fail "HTTP $verb $path as $who: got $got, expected $want"
}
cert() { echo --cert "$1.pem" --key "$1.key"; }
# A static asset of the dashboard (only when the build bundled it: web/ needs node).
asset="" page=404
[ -f "$(dirname "$bin")/web/app.js" ] && asset=/app.js page=200
[ -n "$asset" ] || echo "note: no dashboard assets in $(dirname "$bin")/web: / is 404, no static row"
for path in / $asset /metrics /api/jobs "/api/job?id=$job" /api/workers "/api/memory?host=worker-0" \
    "/api/series?job=$job" "/api/watch?job=$job&since_step=16" /login /logout; do
  method=() verb=GET
  ok=200 none=401 role=403 scrape=403
  case $path in
    /) ok=$page ;;
    /metrics) scrape=200 ;;
    /login) none=200 role=200 scrape=200 ;;  # the form itself is open
    /logout) method=(--data "") verb=POST; ok=303 none=303 role=303 scrape=303 ;;  # clears the cookie
  esac
  [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "${method[@]}" "http://127.0.0.1:$http$path")" = 000 ] \
    || fail "$path answered plain http:// on the HTTPS port"
  cell "$none" "$path" "no identity"
  cell "$none" "$path" "an unknown token" -H "Authorization: Bearer nope"
  cell "$ok" "$path" "a view token" -H "Authorization: Bearer $view_token"
  cell "$ok" "$path" "a submit token" -H "Authorization: Bearer $submit_token"
  cell "$ok" "$path" "an admin token" -H "Authorization: Bearer $admin_token"
  cell "$scrape" "$path" "a scrape token" -H "Authorization: Bearer $scrape_token"
  cell "$ok" "$path" "a view certificate" $(cert "$ca/dash")
  cell "$ok" "$path" "a submit certificate" $(cert "$ca/sub")
  cell "$ok" "$path" "an admin certificate" $(cert "$ca/adm")
  cell "$role" "$path" "a worker certificate" $(cert "$ca/worker-0")
  cell "$role" "$path" "the coordinator's certificate" $(cert "$ca/coordinator")
  cell 000 "$path" "an untrusted certificate (refused at the handshake)" $(cert "$tmp/other-ca/eve")
  cell 000 "$path" "an expired certificate (refused at the handshake)" $(cert "$ca/old")
done
method=()
# The page's login: a browser is sent to /login; the form sets the cookie the page then uses.
c=$(code -H "Accept: text/html" -D "$tmp/redirect.txt" "https://coordinator:$http/")
[ "$c" = 303 ] && grep -qi "^location: /login" "$tmp/redirect.txt" || fail "no redirect to /login ($c)"
[ "$(code "https://coordinator:$http/login")" = 200 ] || fail "login form"
# A browser's own form sends its Origin; another site's form is refused (login CSRF).
own=(-H "Origin: https://coordinator:$http")
[ "$(code -X POST "${own[@]}" --data-urlencode "token=nope" "https://coordinator:$http/login")" = 401 ] \
  || fail "login with an unknown token"
[ "$(code -X POST "${own[@]}" --data-urlencode "token=$scrape_token" "https://coordinator:$http/login")" = 401 ] \
  || fail "login with a scrape token"
[ "$(code -X POST -H "Origin: https://evil.example" --data-urlencode "token=$view_token" \
    "https://coordinator:$http/login")" = 403 ] || fail "cross-origin login not refused"
c=$(code -X POST "${own[@]}" --data-urlencode "token=$view_token" -c "$tmp/cookies" "https://coordinator:$http/login")
[ "$c" = 303 ] || fail "login: $c"
grep -q "meshrun_token" "$tmp/cookies" || fail "login set no cookie"
[ "$(code -b "$tmp/cookies" "https://coordinator:$http/api/jobs")" = 200 ] || fail "login cookie"
c=$(code --cookie "meshrun_token=$view_token" "https://coordinator:$http/api/jobs")
[ "$c" = 200 ] || fail "cookie login: $c"
c=$(code --data "" -D "$tmp/logout.txt" -b "$tmp/cookies" "https://coordinator:$http/logout")
[ "$c" = 303 ] && grep -qi "^set-cookie: meshrun_token=;.*Max-Age=0" "$tmp/logout.txt" \
  || fail "logout did not clear the cookie ($c): $(cat "$tmp/logout.txt")"
grep -q "refused HTTP GET /metrics from 127.0.0.1" "$tmp/coordinator.log" || fail "HTTP refusal not logged"
# The coordinator's certificate reissued while it runs: the next HTTPS handshake serves the new
# one (compared by serial number), no restart.
serial() { openssl x509 -noout -serial "$@" | cut -d= -f2; }
served() { openssl s_client -connect "127.0.0.1:$http" -CAfile "$ca/ca.pem" </dev/null 2>/dev/null \
  | serial; }
old_serial=$(serial -in "$ca/coordinator.pem")
[ "$(served)" = "$old_serial" ] || fail "HTTPS does not serve the coordinator's certificate"
"$bin/meshrun" certs issue --dir="$ca" --role=coordinator --name=coordinator >/dev/null || fail "reissue"
new_serial=$(serial -in "$ca/coordinator.pem")
[ "$new_serial" != "$old_serial" ] || fail "the reissued certificate kept its serial"
for _ in $(seq 20); do [ "$(served)" = "$new_serial" ] && break; sleep 0.25; done
[ "$(served)" = "$new_serial" ] || fail "HTTPS still serves serial $(served), not the reissued $new_serial"
[ "$(code -H "Authorization: Bearer $view_token" "https://coordinator:$http/api/jobs")" = 200 ] \
  || fail "HTTPS after the rotation"
kill -0 "$coordinator_pid" || fail "the coordinator did not survive the rotation"
# Revoking a token (removing its line) takes effect without a restart.
grep -v " view " "$ca/tokens" >"$ca/tokens.new" && mv "$ca/tokens.new" "$ca/tokens"
sleep 1.2
[ "$(code -H "Authorization: Bearer $view_token" "https://coordinator:$http/metrics")" = 401 ] \
  || fail "revoked token still accepted over HTTP"
if scli --token="$view_token" list >/dev/null 2>&1; then fail "revoked token still accepted"; fi

# Draining a worker is the admin's: the worker finishes, deregisters (LEFT) and exits.
if scli --token="$submit_token" drain worker-3 >"$tmp/bad.txt" 2>&1; then
  fail "a submit token drained a worker"
fi
grep -q "needs role admin" "$tmp/bad.txt" || fail "drain refusal: $(cat "$tmp/bad.txt")"
scli --token="$admin_token" drain worker-3 >"$tmp/drain.txt" 2>&1 || fail "drain: $(cat "$tmp/drain.txt")"
for _ in $(seq 60); do kill -0 "$worker3_pid" 2>/dev/null || break; sleep 0.5; done
kill -0 "$worker3_pid" 2>/dev/null && fail "worker-3 did not exit after the drain"
grep "^worker-3 " <<<"$(scli --token="$admin_token" workers)" | grep -q LEFT \
  || fail "worker-3 is not LEFT: $(scli --token="$admin_token" workers)"

# 5. A server with worker-1's certificate posing as the coordinator: the CLI, and the Python SDK,
#    refuse it at the handshake (the token is never sent), naming what they expected.
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/impostor" $(tls worker-1) \
  >"$tmp/impostor.log" 2>&1 &
pids+=($!)
real=$port
await_coordinator "$tmp/impostor.log"
if "$bin/meshrun" --coordinator="127.0.0.1:$port" --tls_ca="$ca/ca.pem" --token="$admin_token" list \
    >"$tmp/bad.txt" 2>&1; then
  fail "the CLI talked to a worker posing as the coordinator"
fi
grep -q "expected spiffe://<cluster>/coordinator/<any name>" "$tmp/bad.txt" \
  && grep -q "presented spiffe://test/worker/worker-1" "$tmp/bad.txt" \
  || fail "impostor error unclear: $(cat "$tmp/bad.txt")"
if [ -x "$src/.venv/bin/python" ]; then
  bash "$src/scripts/install_sdk.sh" >/dev/null
  sdk() { "$src/.venv/bin/python" -c "import sys, meshrun
print(len(meshrun.Client(sys.argv[1], tls_ca=sys.argv[2], token=sys.argv[3], timeout=3).list()))" "$@"; }
  sdk "127.0.0.1:$real" "$ca/ca.pem" "$admin_token" >/dev/null 2>"$tmp/sdk.txt" \
    || fail "SDK against the coordinator: $(tail -3 "$tmp/sdk.txt")"
  if sdk "127.0.0.1:$port" "$ca/ca.pem" "$admin_token" >/dev/null 2>"$tmp/sdk.txt"; then
    fail "the SDK talked to a worker posing as the coordinator"
  fi
  grep -q "UNAVAILABLE" "$tmp/sdk.txt" || fail "SDK impostor error: $(tail -3 "$tmp/sdk.txt")"
fi
echo "PASS"
