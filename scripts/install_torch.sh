#!/usr/bin/env bash
# Installs the PyTorch path of the SDK (meshrun.torch, docs/torch.md): pinned torch and torchax
# in a second venv, .venv-torch, which sees the project venv's packages (JAX, numpy, the
# meshrun SDK, pytest) through a .pth file, so JAX is the one pinned in scripts/fetch_pjrt.sh.
#
#   ~/.cache/meshrun/downloads/torch-<version>/   the wheels, downloaded once
#   .venv-torch/                                 torch + torchax (+ their dependencies)
#
# Why a second venv: the package index's torch is the CUDA build (about 4.1 GB of wheels,
# 7 GB installed) and pins its own dependencies; the demo and every other test never import
# it, and keeping it apart means its pins cannot move what the rest of the project runs
# with, and deleting .venv-torch (or MESHRUN_SKIP_TORCH=1) drops it without touching .venv.
#
# Idempotent: a second run downloads nothing and installs nothing (the versions are checked
# first; a missing venv is rebuilt from the cached wheels, offline). Needs .venv
# (scripts/fetch_pjrt.sh). MESHRUN_SKIP_TORCH=1 skips it; the torch tests then skip.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TORCH_VERSION=2.9.0
TORCHAX_VERSION=0.0.13   # works with jax 0.8.1 (scripts/fetch_pjrt.sh JAX_VERSION)
if [ "${MESHRUN_SKIP_TORCH:-0}" = 1 ]; then
  echo "install_torch: skipped (MESHRUN_SKIP_TORCH=1)"
  exit 0
fi
base="$root/.venv/bin/python"
[ -x "$base" ] || { echo "install_torch: $base absent; run scripts/setup.sh" >&2; exit 1; }
venv="$root/.venv-torch"
py="$venv/bin/python"
cache="${MESHRUN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/meshrun}/downloads/torch-$TORCH_VERSION"
base_site="$("$base" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"

have() { "$py" -c "import sys; from importlib.metadata import version; \
sys.exit(version(sys.argv[1]) != sys.argv[2])" "$1" "$2" 2>/dev/null; }
link_base() {  # the project venv's packages, after .venv-torch's own
  local site
  site="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  echo "$base_site" >"$site/meshrun_project_venv.pth"
}

if [ -x "$py" ] && have torch "$TORCH_VERSION" && have torchax "$TORCHAX_VERSION"; then
  link_base   # the project venv may have moved (a fresh clone's venv)
  echo "install_torch: torch $TORCH_VERSION and torchax $TORCHAX_VERSION present in .venv-torch"
  exit 0
fi
if [ ! -x "$py" ]; then
  echo "install_torch: creating .venv-torch"
  "$("$base" -c 'import sys; print(sys._base_executable)')" -m venv "$venv"
  # The venv's own old setuptools would shadow .venv's, which builds the SDK (install_sdk.sh).
  "$py" -m pip uninstall --quiet --yes setuptools
fi
link_base
reqs=("torch==$TORCH_VERSION" "torchax==$TORCHAX_VERSION")
mkdir -p "$cache"
if ! "$py" -m pip install --quiet --disable-pip-version-check --no-input --only-binary=:all: \
    --no-index --find-links "$cache" "${reqs[@]}" 2>/dev/null; then
  echo "install_torch: downloading ${reqs[*]} and their dependencies (about 4.1 GB) to $cache"
  start=$(date +%s)
  "$py" -m pip download --quiet --disable-pip-version-check --no-input --only-binary=:all: \
    --dest "$cache" "${reqs[@]}"
  echo "install_torch: downloaded $(du -sh "$cache" | cut -f1) in $(( $(date +%s) - start ))s"
  "$py" -m pip install --quiet --disable-pip-version-check --no-input --only-binary=:all: \
    --no-index --find-links "$cache" "${reqs[@]}"
fi
have torch "$TORCH_VERSION" && have torchax "$TORCHAX_VERSION" \
  || { echo "install_torch: torch/torchax not at the pinned versions after install" >&2; exit 1; }
echo "install_torch: torch $TORCH_VERSION and torchax $TORCHAX_VERSION installed in .venv-torch"
