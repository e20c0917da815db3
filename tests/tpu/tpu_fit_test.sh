#!/usr/bin/env bash
# A model too large for v6e HBM (one replicated 32 GiB weight) is refused by `meshrun compile`
# with exit 1, naming the program, the bytes it needs and the bytes a chip has.
#   tpu_fit_test.sh <bin dir> <source dir>
set -euo pipefail
bin="$1" src="$2"
libtpu="$src/.deps/libtpu/0.0.30/libtpu.so"
[[ -f "$libtpu" ]] || { echo "SKIP: $libtpu missing (scripts/fetch_libtpu.sh)"; exit 77; }
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$src/.venv/bin/python" "$src/tests/tpu/too_large_bundle.py" "$work/bundle" "$src/examples"
set +e
TPU_LIBRARY_PATH="$libtpu" "$bin/meshrun" compile "$work/bundle" --target=v6e-8 \
  >"$work/out" 2>"$work/err"
rc=$?
set -e
grep -v '^WARNING\|^E0000\|^===\|Source Location\|learning/' "$work/err" || true
[[ $rc == 1 ]] || { echo "FAIL: exit $rc, expected 1"; exit 1; }
grep -q "does not fit v6e-8: program init needs 32.00 GiB per device.*a v6e chip has 32.00 GiB" \
  "$work/err" || { echo "FAIL: init's refusal lacks its bytes and the chip's"; exit 1; }
grep -q "does not fit v6e-8: program step .*Used 32.00G of 31.25G hbm" "$work/err" ||
  { echo "FAIL: step's refusal lacks XLA's figures"; exit 1; }
if grep -q "^fits" "$work/out"; then echo "FAIL: printed fits"; exit 1; fi
echo "PASS"
