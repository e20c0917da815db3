#!/usr/bin/env bash
# Memory soak (issue 16, docs/limits.md): 10,000 tiny jobs submitted and finished plus a
# key-value flood; past the first 2,000 (beyond --max_finished_jobs, so pruning is at work) the
# coordinator's RSS must grow by less than 32 MiB over the remaining 8,000.
# Usage: memory_soak_test.sh <directory holding meshrun-coordinator> <source dir>
set -euo pipefail
bin="$1"; src="$2"
[ -x "$src/.venv/bin/python" ] || { echo "SKIP: $src/.venv absent (scripts/setup.sh)"; exit 77; }
bash "$src/scripts/install_sdk.sh"   # the generated stubs of proto/
exec "$src/.venv/bin/python" "$src/tests/memory_soak.py" "$bin" --jobs=10000 --warmup=2000 \
  --kv_rounds=4 --max_growth_mib=32
