#!/usr/bin/env bash
# Compiles a bundle for TPU slices with `meshrun compile` through libtpu on this CPU-only host,
# and (with --fidelity) checks that the optimized HLO of the first target equals JAX's AOT
# compile of the same program for the same topology (fidelity_check.py).
#   tpu_compile_test.sh <bin dir> <source dir> <bundle> <libtpu version> [--fidelity] <target>...
# Exit 77 (skip) when set-up has not fetched that libtpu.
set -euo pipefail
bin="$1" src="$2" bundle="$3" version="$4"
shift 4
fidelity=0
if [[ "${1:-}" == "--fidelity" ]]; then fidelity=1; shift; fi
libtpu="$src/.deps/libtpu/$version/libtpu.so"
[[ -f "$libtpu" ]] || { echo "SKIP: $libtpu missing (scripts/fetch_libtpu.sh)"; exit 77; }
export TPU_LIBRARY_PATH="$libtpu"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
[[ "$bundle" = /* ]] || bundle="$src/$bundle"
first=1
for target in "$@"; do
  out="$work/$target.txt"
  start=$(date +%s.%N)
  if ! "$bin/meshrun" compile "$bundle" --target="$target" --hlo_out="$work/hlo-$target" \
       >"$out" 2>"$work/stderr"; then
    cat "$out"; grep -v '^WARNING\|^E0000\|^===\|Source Location\|learning/' "$work/stderr" || true
    echo "FAIL: meshrun compile ${bundle#"$src"/} --target=$target (libtpu $version)"
    exit 1
  fi
  cat "$out"
  grep -q "^fits $target\$" "$out" || { echo "FAIL: no 'fits $target' line"; exit 1; }
  # Every program reports its bytes per device and FLOPs.
  awk 'NR > 2 && $1 ~ /^(init|step|grad|apply)$/ && ($2 == "0" || $7 == "-") { bad = 1 }
       END { exit bad }' "$out" || { echo "FAIL: a program without bytes or FLOPs"; exit 1; }
  echo "ok: ${bundle#"$src"/} for $target in $(echo "$(date +%s.%N) - $start" | bc) s"
  if [[ $fidelity == 1 && $first == 1 ]]; then
    topology="$(sed -n 's/^target [^:]*: topology \([^,]*\),.*/\1/p' "$out")"
    case "$target" in
      *-8) bounds=2,4,1 ;;
      *) bounds=2,2,1 ;;
    esac
    "$src/.venv/bin/python" "$src/tests/tpu/fidelity_check.py" "$bundle" "$work/hlo-$target" \
      "$topology" "$bounds" "$libtpu" 2>"$work/stderr" ||
      { grep -v '^WARNING\|^E0000\|^===\|Source Location\|learning/' "$work/stderr" || true; exit 1; }
  fi
  first=0
done
echo "PASS"
