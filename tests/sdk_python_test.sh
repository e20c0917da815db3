#!/usr/bin/env bash
# The Python SDK's pytest suite (python/tests) in the project venv, against the real binaries
# in $1: export, data files and meshrun.Client through a real coordinator and worker.
set -euo pipefail
bin="$1"; src="$2"
[ -x "$src/.venv/bin/python" ] || { echo "SKIP: $src/.venv absent (scripts/setup.sh)"; exit 77; }
bash "$src/scripts/install_sdk.sh"   # current python/ and proto/, idempotent
cd "$src/python/tests"
MESHRUN_BIN_DIR="$bin" exec "$src/.venv/bin/python" -m pytest -q -p no:cacheprovider "${@:3}" .
