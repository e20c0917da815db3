#!/usr/bin/env bash
# meshrun.torch (docs/torch.md) in .venv-torch, against the real binaries in $1: the committed
# examples/torch_gpt regenerates byte for byte, then python/tests/test_torch.py (what is
# refused, with which error; initial weights as a checkpoint; tied weights) and
# test_torch_cluster.py (a coordinator and two 4-device workers: an MLP with SGD, Adam, AdamW
# and bf16, and the torch GPT over both hosts on real text, against eager PyTorch on the CPU).
# Exits 77 (skipped) when .venv-torch is absent (scripts/install_torch.sh, MESHRUN_SKIP_TORCH).
# Usage: torch_test.sh <directory of the binaries> <source directory> [pytest arguments]
set -euo pipefail
bin="$1"; src="$2"
py="$src/.venv-torch/bin/python"
[ -x "$py" ] || { echo "SKIP: $py absent (scripts/install_torch.sh)"; exit 77; }
MESHRUN_VENV="$src/.venv-torch" bash "$src/scripts/install_sdk.sh"   # current python/, idempotent
"$py" "$src/examples/export_torch_gpt.py" --check 2>/dev/null
cd "$src/python/tests"
MESHRUN_BIN_DIR="$bin" exec "$py" -m pytest -q -p no:cacheprovider -s \
  -W "ignore::UserWarning" "${@:3}" test_torch.py test_torch_cluster.py
