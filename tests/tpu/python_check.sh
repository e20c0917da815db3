#!/usr/bin/env bash
# Runs a tpu check written in Python with the SDK of this checkout installed in .venv (the
# checks import meshrun and its generated gRPC stubs).
#   python_check.sh <source dir> <check.py> <args>...
set -euo pipefail
src="$1"
shift
bash "$src/scripts/install_sdk.sh" >/dev/null
exec "$src/.venv/bin/python" "$@"
