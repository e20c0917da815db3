#!/usr/bin/env bash
# Regenerates examples/ with the pinned JAX into a temporary directory and compares every file
# with the committed one (the programs go through python/meshrun/export.py, so a change there
# that moves their bytes fails here). Exit 77 (ctest: skipped) when that JAX is not installed.
#   examples/check_regenerated.sh [python]     default: .venv/bin/python
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
python="${1:-$root/.venv/bin/python}"
if [[ ! -x "$python" ]]; then
  echo "skipped: no Python with JAX at $python (scripts/fetch_pjrt.sh creates .venv)"
  exit 77
fi
# export_examples.py lowers through meshrun.export: install the checkout's python/ (idempotent).
if [[ "$python" == "$root/.venv/bin/python" ]]; then
  bash "$root/scripts/install_sdk.sh" >&2 || exit 1
fi
exec "$python" "$root/examples/export_examples.py" --check
