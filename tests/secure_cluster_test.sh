#!/usr/bin/env bash
# A secured cluster with the real binaries on loopback, set up as docs/security.md says:
# `meshrun certs` makes the CA, the coordinator's and workers' certificates and two tokens;
# every link is mutual TLS and the CLI authenticates with bearer tokens.
#   1. plaintext on a non-loopback address is refused without --insecure, and flagged with it;
#   2. a worker whose certificate names another host is refused; callers without a token, or
#      with a role too small, get UNAUTHENTICATED / PERMISSION_DENIED naming the role;
#   3. the main job path (submit, distribute, train, watch, export) succeeds over mTLS;
#   4. every HTTPS endpoint against no identity, unknown token, each role's token, a view client
#      certificate, a scrape token, the login form and its cookie;
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
curl -sf "http://127.0.0.1:$http/metrics" | grep -q "^meshrun_insecure_plaintext 1" || fail "/metrics does not flag --insecure"
"$bin/meshrun" --coordinator="127.0.0.1:$plain" workers | grep -q PLAINTEXT || fail "workers does not flag --insecure"
kill $insecure

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
pids+=($!)
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
scli --token_file="$tmp/submit.token" submit "$bundle" --steps=20 --cadence=5 --follow \
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
MESHRUN_TOKEN=$view_token scli workers --expect=4 --wait=30s >/dev/null || fail "4 workers"
scli --token_file="$tmp/submit.token" submit "$src/examples/transformer_lm/dp4x2/job.json" \
  --host_replicas=2 --steps=3 --cadence=1 --follow --wait=300s >"$tmp/replicas.txt" \
  || fail "host-replica job: $(cat "$tmp/replicas.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/replicas.txt" || fail "replicas: $(cat "$tmp/replicas.txt")"
if grep "refused" "$tmp/coordinator.log" | grep -q "collectives/"; then fail "a member's key refused"; fi

# 4. Every HTTPS endpoint: 401 without a token or with an unknown one, 200 for each role's token.
http=$(sed -n "s/.*HTTP on port \([0-9]*\).*/\1/p" "$tmp/coordinator.log" | head -1)
admin_token=$("$bin/meshrun" certs token --role=admin --name=ops --tokens_file="$ca/tokens")
scrape_token=$("$bin/meshrun" certs token --role=metrics --name=prometheus --tokens_file="$ca/tokens")
"$bin/meshrun" certs issue --dir="$ca" --role=client --roles=view --name=dash >/dev/null || fail "issue dash"
"$bin/meshrun" certs issue --dir="$ca" --role=client --roles=admin --name=old --days=-1 >/dev/null \
  || fail "issue an expired certificate"
"$bin/meshrun" certs init --dir="$tmp/other-ca" --cluster=test >/dev/null || fail "other CA"
"$bin/meshrun" certs issue --dir="$tmp/other-ca" --role=client --roles=admin --name=eve >/dev/null \
  || fail "issue eve"
sleep 1.2  # the tokens file is rechecked once a second
# HTTPS with the coordinator's certificate (its DNS SAN is "coordinator"), checked against the CA.
code() { curl -s -o /dev/null -w '%{http_code}' --max-time 3 --cacert "$ca/ca.pem" \
  --resolve "coordinator:$http:127.0.0.1" "$@"; }
[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "http://127.0.0.1:$http/metrics")" = 000 ] \
  || fail "plain HTTP answered on the HTTPS port"
for path in / /metrics /api/jobs "/api/job?id=$job" /api/workers "/api/memory?host=worker-0" \
    "/api/series?job=$job" "/api/watch?job=$job&since_step=100"; do
  [ "$(code "https://coordinator:$http$path")" = 401 ] || fail "$path without a token"
  [ "$(code -H "Authorization: Bearer nope" "https://coordinator:$http$path")" = 401 ] \
    || fail "$path with an unknown token"
  for t in "$view_token" "$submit_token" "$admin_token"; do
    c=$(code -H "Authorization: Bearer $t" "https://coordinator:$http$path")
    [ "$c" != 401 ] && [ "$c" != 403 ] || fail "$path refused a valid token ($c)"
  done
  c=$(code --cert "$ca/dash.pem" --key "$ca/dash.key" "https://coordinator:$http$path")
  [ "$c" != 401 ] && [ "$c" != 403 ] || fail "$path refused a view client certificate ($c)"
  [ "$(code --cert "$ca/worker-0.pem" --key "$ca/worker-0.key" "https://coordinator:$http$path")" = 403 ] \
    || fail "$path: a worker certificate is not a viewer"
  [ "$(code --cert "$tmp/other-ca/eve.pem" --key "$tmp/other-ca/eve.key" "https://coordinator:$http$path")" = 000 ] \
    || fail "$path: an untrusted client certificate was not refused at the handshake"
  [ "$(code --cert "$ca/old.pem" --key "$ca/old.key" "https://coordinator:$http$path")" = 000 ] \
    || fail "$path: an expired client certificate was not refused at the handshake"
  c=$(code -H "Authorization: Bearer $scrape_token" "https://coordinator:$http$path")
  if [ "$path" = /metrics ]; then [ "$c" = 200 ] || fail "scrape token on /metrics: $c"
  else [ "$c" = 403 ] || fail "scrape token on $path: $c"; fi
done
# The page's login: a browser is sent to /login; the form sets the cookie the page then uses.
c=$(code -H "Accept: text/html" -D "$tmp/redirect.txt" "https://coordinator:$http/")
[ "$c" = 303 ] && grep -qi "^location: /login" "$tmp/redirect.txt" || fail "no redirect to /login ($c)"
[ "$(code "https://coordinator:$http/login")" = 200 ] || fail "login form"
[ "$(code -X POST --data-urlencode "token=nope" "https://coordinator:$http/login")" = 401 ] \
  || fail "login with an unknown token"
[ "$(code -X POST --data-urlencode "token=$scrape_token" "https://coordinator:$http/login")" = 401 ] \
  || fail "login with a scrape token"
c=$(code -X POST --data-urlencode "token=$view_token" -c "$tmp/cookies" "https://coordinator:$http/login")
[ "$c" = 303 ] || fail "login: $c"
grep -q "meshrun_token" "$tmp/cookies" || fail "login set no cookie"
[ "$(code -b "$tmp/cookies" "https://coordinator:$http/api/jobs")" = 200 ] || fail "login cookie"
c=$(code --cookie "meshrun_token=$view_token" "https://coordinator:$http/api/jobs")
[ "$c" = 200 ] || fail "cookie login: $c"
grep -q "refused HTTP GET /metrics from 127.0.0.1" "$tmp/coordinator.log" || fail "HTTP refusal not logged"
# Revoking a token (removing its line) takes effect without a restart.
grep -v " view " "$ca/tokens" >"$ca/tokens.new" && mv "$ca/tokens.new" "$ca/tokens"
sleep 1.2
[ "$(code -H "Authorization: Bearer $view_token" "https://coordinator:$http/metrics")" = 401 ] \
  || fail "revoked token still accepted over HTTP"
if scli --token="$view_token" list >/dev/null 2>&1; then fail "revoked token still accepted"; fi

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
