#!/usr/bin/env bash
# Submit-time refusals, path confinement and the SubmitJob rate limit through a real
# coordinator (tests/limits_submit_test.py). Usage: limits_submit_test.sh <bin dir> <source dir>
set -euo pipefail
bin="$1"; src="$2"
[ -x "$src/.venv/bin/python" ] || { echo "SKIP: $src/.venv absent (scripts/setup.sh)"; exit 77; }
bash "$src/scripts/install_sdk.sh"   # the generated stubs of proto/
exec "$src/.venv/bin/python" "$src/tests/limits_submit_test.py" "$bin"
