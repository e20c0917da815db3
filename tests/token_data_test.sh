#!/usr/bin/env bash
# Real data through the real binaries on loopback: a coordinator and one worker (8 CPU devices),
# the transformer LM bundle submitted on token shards that examples/make_token_shards.py wrote
# from real text (a file of Debian's fortunes package).
#   1. the job SUCCEEDS and `meshrun get` shows its data receipt (files, sha256 = the files'
#      bytes hashed in order, tokens, documents);
#   2. a glob matching no file, and a corrupt shard, are refused at submit naming
#      data.token_shards_glob (and the file); no job is created;
#   3. --data=synthetic runs, with the receipt and every telemetry row marked synthetic.
# Usage: token_data_test.sh <directory of the binaries> <source directory>
# Exits 77 (skipped) when the fortunes text or the project's Python is absent.
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/transformer_lm/dp8/job.json"
source "$(dirname "$0")/cluster_lib.sh"
fortune_shards
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" --data_root="$tmp" \
  >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=worker-0 \
  --state_dir="$tmp/worker-0" --cpu_devices=8 >"$tmp/worker-0.log" 2>&1 &
pids+=($!)
cli workers --expect=1 --wait=30s >/dev/null || fail "worker did not register"

# 1. Token shards: SUCCEEDED with the receipt.
cli submit "$bundle" --data="$tmp/shards/*.tok" --steps=20 --cadence=10 --follow --output=textproto --wait=300s \
  >"$tmp/job1.txt" || fail "token-shard job did not succeed: $(cat "$tmp/job1.txt")"
grep -q "state: JOB_STATE_SUCCEEDED" "$tmp/job1.txt" || fail "job 1 state"
grep -q "token_shards_glob: \"$tmp/shards/\*.tok\"" "$tmp/job1.txt" || fail "job 1 glob"
files=$(ls "$tmp"/shards/*.tok | sort)
[ "$(echo "$files" | wc -l)" -gt 1 ] || fail "expected several shards"
for f in $files; do grep -q "files: \"$f\"" "$tmp/job1.txt" || fail "receipt misses $f"; done
sha=$(cat $files | sha256sum | cut -d' ' -f1)
grep -q "sha256: \"$sha\"" "$tmp/job1.txt" || fail "receipt sha256 is not $sha: $(cat "$tmp/job1.txt")"
bytes=$(cat $files | wc -c)
grep -q "bytes: $bytes\$" "$tmp/job1.txt" || fail "receipt bytes is not $bytes"
docs=$(grep -c '^%$' "$text")
grep -q "documents: $docs\$" "$tmp/job1.txt" || fail "receipt documents is not $docs"
grep -q "tokens: " "$tmp/job1.txt" || fail "receipt has no tokens"
grep -q "synthetic: true" "$tmp/job1.txt" && fail "real data marked synthetic"

# 2. Refused at submit, naming the field and the file; no job is added.
before=$(cli list | wc -l)
if cli submit "$bundle" --data="$tmp/nothing/*.tok" >"$tmp/bad1.txt" 2>&1; then
  fail "a glob matching nothing was accepted"
fi
grep -q "spec.data.token_shards_glob \"$tmp/nothing/\*.tok\"" "$tmp/bad1.txt" \
  || fail "missing data refusal unclear: $(cat "$tmp/bad1.txt")"
mkdir "$tmp/corrupt"
cp "$tmp"/shards/*.tok "$tmp/corrupt/"
last=$(ls "$tmp"/corrupt/*.tok | sort | tail -1)
truncate -s -5 "$last"
if cli submit "$bundle" --data="$tmp/corrupt/*.tok" >"$tmp/bad2.txt" 2>&1; then
  fail "a truncated shard was accepted"
fi
grep -q "$last: truncated" "$tmp/bad2.txt" || fail "corrupt refusal unclear: $(cat "$tmp/bad2.txt")"
[ "$(cli list | wc -l)" = "$before" ] || fail "a refused submission created a job"

# 3. Synthetic by name: marked in the receipt and in every summary.
cli submit "$bundle" --data=synthetic --steps=20 --cadence=10 --follow --output=textproto --wait=300s \
  >"$tmp/job2.txt" || fail "synthetic job did not succeed: $(cat "$tmp/job2.txt")"
grep -q "synthetic: true" "$tmp/job2.txt" || fail "synthetic receipt not marked"
grep -q "files:" "$tmp/job2.txt" && fail "synthetic receipt lists files"
job=$(sed -n 's/^job_id: "\(.*\)"$/\1/p' "$tmp/job2.txt")
cli watch "$job" --since_step=1 >"$tmp/watch.txt" || fail "watch failed"
rows=$(awk '$1 ~ /^[0-9]+$/' "$tmp/watch.txt" | wc -l)
[ "$rows" -eq 2 ] || fail "watch rows: $(cat "$tmp/watch.txt")"
[ "$(grep -c "SYNTHETIC DATA" "$tmp/watch.txt")" -eq "$rows" ] \
  || fail "summaries not marked synthetic: $(cat "$tmp/watch.txt")"
echo "token_data_test: all checks passed"
