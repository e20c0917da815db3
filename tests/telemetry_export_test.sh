#!/usr/bin/env bash
# `meshrun export` of a real job's history, with the real binaries on loopback: a coordinator
# and a worker (8 CPU devices) run the transformer LM, whose sink mass is a 6x4 series.
#   1. csv, jsonl and tensorboard exports of the same history agree: one csv row per (step,
#      series, element), one jsonl line per step, and TensorBoard's own event reader
#      (tensorboard_check.py, run with the project venv) sees every step and value of the history;
#   2. bad input is refused clearly: a malformed format lists the formats, an unknown job is
#      NOT_FOUND naming it, an unknown series is named; nothing is written.
# Usage: telemetry_export_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$2
bundle="$src/examples/transformer_lm/dp8/job.json"
python="$src/.venv/bin/python"
source "$(dirname "$0")/cluster_lib.sh"
[ -f "$bundle" ] || fail "bundle $bundle missing"
"$python" -c "import tensorboard" 2>/dev/null || fail "tensorboard missing from .venv: run scripts/fetch_pjrt.sh"

"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" \
  >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 --coordinator="127.0.0.1:$port" --host=worker-0 \
  --state_dir="$tmp/worker-0" >"$tmp/worker-0.log" 2>&1 &
pids+=($!)
cli workers --expect=1 --wait=30s >/dev/null || fail "the worker did not register"
cli submit "$bundle" --steps=20 --cadence=5 --follow --output=textproto --wait=120s >"$tmp/job.txt" \
  || fail "job did not succeed: $(cat "$tmp/job.txt")"
job=$(sed -n 's/^job_id: "\(.*\)"$/\1/p' "$tmp/job.txt" | head -1)
[ -n "$job" ] || fail "no job id in $(head -5 "$tmp/job.txt")"

# 1. Three formats of one history.
cli export "$job" --format=jsonl --out="$tmp/history.jsonl" 2>"$tmp/export.log" || fail "jsonl export"
grep -q "exported 4 steps of $job" "$tmp/export.log" || fail "jsonl: $(cat "$tmp/export.log")"
[ "$(wc -l <"$tmp/history.jsonl")" -eq 4 ] || fail "jsonl lines: $(wc -l <"$tmp/history.jsonl")"
cli export "$job" --format=csv >"$tmp/history.csv" 2>/dev/null || fail "csv export"
head -1 "$tmp/history.csv" | grep -qx "step,wall_time_unix_micros,series,element,index,value,partial" \
  || fail "csv header: $(head -1 "$tmp/history.csv")"
# One csv row per element of every series of every step, as many as the jsonl holds values.
elements=$("$python" -c "import json,sys; print(sum(len(s['values']) for l in open(sys.argv[1]) for s in json.loads(l)['values'].values()))" "$tmp/history.jsonl")
[ "$(($(wc -l <"$tmp/history.csv") - 1))" -eq "$elements" ] || fail "csv rows vs $elements elements"
cli export "$job" --format=tensorboard --out="$tmp/tb" 2>/dev/null || fail "tensorboard export"
events=$(ls "$tmp"/tb/events.out.tfevents.*.*)
[ "$(echo "$events" | wc -l)" -eq 1 ] || fail "event files: $events"
"$python" "$src/tests/tensorboard_check.py" "$events" "$tmp/history.jsonl" || fail "tensorboard check"
# Only some series, from a step on.
cli export "$job" --format=jsonl --series=loss --since_step=10 >"$tmp/loss.jsonl" 2>/dev/null || fail "--series export"
[ "$(wc -l <"$tmp/loss.jsonl")" -eq 3 ] || fail "since_step 10: $(wc -l <"$tmp/loss.jsonl") lines"
grep -q '"values":{"loss":{"shape":\[\],"values":\[[^]]*\]}}}$' "$tmp/loss.jsonl" || fail "--series=loss: $(head -1 "$tmp/loss.jsonl")"

# 2. Bad input.
if cli export "$job" --format=parquet >"$tmp/bad.txt" 2>&1; then fail "format parquet accepted"; fi
grep -q "parquet" "$tmp/bad.txt" && grep -q "csv, jsonl, tensorboard" "$tmp/bad.txt" || fail "format error: $(cat "$tmp/bad.txt")"
if cli export job-404 --format=csv --out="$tmp/none.csv" >"$tmp/bad.txt" 2>&1; then fail "unknown job exported"; fi
grep -q "NOT_FOUND" "$tmp/bad.txt" && grep -q "job-404" "$tmp/bad.txt" || fail "unknown job error: $(cat "$tmp/bad.txt")"
[ ! -e "$tmp/none.csv" ] || fail "a refused export wrote a file"
if cli export "$job" --format=tensorboard --series=no_such --out="$tmp/tb-bad" >"$tmp/bad.txt" 2>&1; then fail "unknown series exported"; fi
grep -q '"no_such"' "$tmp/bad.txt" || fail "unknown series error: $(cat "$tmp/bad.txt")"
[ ! -e "$tmp/tb-bad" ] || fail "a refused export created its directory"
[ "$("$bin/meshrun" health "127.0.0.1:$port")" = "SERVING" ] || fail "coordinator harmed"
echo "telemetry_export_test: all checks passed"
