#!/usr/bin/env bash
# Regenerates examples/ with the pinned JAX into a temporary directory and compares every file
# with the committed one. Exit 77 (ctest: skipped) when that JAX is not installed.
#   examples/check_regenerated.sh [python]     default: .venv/bin/python
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-$root/.venv/bin/python}"
if [[ ! -x "$python" ]]; then
  echo "skipped: no Python with JAX at $python (scripts/fetch_pjrt.sh creates .venv)"
  exit 77
fi
exec "$python" "$root/examples/export_examples.py" --check
