#!/usr/bin/env bash
# Memory soak (issue 16, docs/limits.md): 500 tiny jobs submitted and finished plus a
# key-value flood; the coordinator's RSS growth over the last 400 must stay under 32 MiB. The
# full 10,000 jobs run in bench/memory_soak_bench.sh.
# Usage: memory_soak_test.sh <directory holding meshrun-coordinator> <source dir>
set -euo pipefail
bin="$1"; src="$2"
[ -x "$src/.venv/bin/python" ] || { echo "SKIP: $src/.venv absent (scripts/setup.sh)"; exit 77; }
bash "$src/scripts/install_sdk.sh"   # the generated stubs of proto/
exec "$src/.venv/bin/python" "$src/tests/memory_soak.py" "$bin" --jobs=500 --warmup=100 --kv_rounds=2 \
  --max_growth_mib=32
