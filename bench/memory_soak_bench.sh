#!/usr/bin/env bash
# The full memory soak of issue 16: 10,000 submitted-and-finished jobs (each with its own 64 KiB
# program) plus a key-value flood against a real coordinator; prints the RSS growth and, last,
# `ratio memory_soak_headroom <bound / growth>` (docs/limits.md).
# Usage: bench/memory_soak_bench.sh [build dir]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
bash "$root/scripts/install_sdk.sh" >/dev/null
exec "$root/.venv/bin/python" "$root/tests/memory_soak.py" "$build/bin" --jobs=10000 \
  --kv_rounds=20 --max_growth_mib=160
