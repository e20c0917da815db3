#!/usr/bin/env bash
# The hostile-client suite (tests/hostile, pytest in the project venv) against the real
# binaries in $1; $2 is the source tree. Stubs: the meshrun package's, generated from proto/
# by scripts/install_sdk.sh (run here, idempotent, so they match this tree's proto/).
set -euo pipefail
bin="$1"; src="$2"
[ -x "$src/.venv/bin/python" ] || { echo "SKIP: $src/.venv absent (scripts/setup.sh)"; exit 77; }
bash "$src/scripts/install_sdk.sh" >/dev/null
cd "$src/tests/hostile"
MESHRUN_BIN_DIR="$bin" exec "$src/.venv/bin/python" -m pytest -q -p no:cacheprovider "${@:3}" .
