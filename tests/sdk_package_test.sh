#!/usr/bin/env bash
# The SDK installs anywhere (issue 28): scripts/build_sdk.sh builds a wheel and an sdist; the
# wheel goes into a fresh venv with grpcio, protobuf and numpy at exactly the floors its metadata
# declares; `pip check` passes; the declared floors equal the versions stamped into the generated
# stubs; that venv's meshrun.Client runs the MLP example on a real coordinator and worker and
# reads its telemetry; and the sdist builds a wheel in another fresh venv (isolated build).
# pip downloads what its cache lacks from the package index.
# Usage: sdk_package_test.sh <directory of the binaries> <source directory>
set -euo pipefail
bin=$1
src=$(cd "$2" && pwd)
source "$(dirname "$0")/cluster_lib.sh"
bundle="$src/examples/mlp_classifier/dp1"
host_python=${MESHRUN_SDK_TEST_PYTHON:-python3}   # the interpreter the fresh venvs are made from
[ -x "$src/.venv/bin/python" ] || { echo "SKIP: $src/.venv absent (scripts/setup.sh)"; exit 77; }
if ! "$host_python" -m venv "$tmp/venv" >"$tmp/venv.log" 2>&1; then
  cat "$tmp/venv.log"
  echo "SKIP: $host_python cannot make a venv (apt-get install python3-venv)"; exit 77
fi
pip_install() {  # pip_install <venv> <args...>: wheels only, no prompts
  "$1/bin/python" -m pip install --quiet --disable-pip-version-check --no-input "${@:2}"
}

# 1. Wheel and sdist, with the grpcio-tools pyproject.toml pins.
bash "$src/scripts/install_sdk.sh" >/dev/null
bash "$src/scripts/build_sdk.sh" "$tmp/dist" >"$tmp/build_sdk.log" 2>&1 ||
  fail "build_sdk.sh failed: $(cat "$tmp/build_sdk.log")"
wheel=$(ls "$tmp"/dist/meshrun-*-py3-none-any.whl) || fail "no py3-none-any wheel"
sdist=$(ls "$tmp"/dist/meshrun-*.tar.gz) || fail "no sdist"

# 2. The floors the wheel declares (Requires-Dist name>=version, extras aside), installed exactly.
floors=$("$tmp/venv/bin/python" - "$wheel" <<'EOF'
import re, sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
deps = {}
for line in meta.splitlines():
    m = re.fullmatch(r"Requires-Dist: ([A-Za-z0-9_.-]+)\s*>=\s*([0-9.]+)", line.strip())
    if m:
        deps[m.group(1).lower()] = m.group(2)
missing = {"grpcio", "protobuf", "numpy"} - set(deps)
if missing:
    sys.exit(f"the wheel declares no floor (name>=version) for {sorted(missing)}: "
             "python/pyproject.toml dependencies")
print(" ".join(f"{k}=={v}" for k, v in sorted(deps.items())))
EOF
) || fail "reading the wheel's metadata"
echo "declared floors: $floors"
# shellcheck disable=SC2086  # one argument per floor
pip_install "$tmp/venv" --only-binary=:all: "$wheel" $floors >"$tmp/pip.log" 2>&1 ||
  fail "installing the wheel at its floors ($floors): $(tail -20 "$tmp/pip.log")"
"$tmp/venv/bin/python" -m pip check --disable-pip-version-check >"$tmp/pip_check.log" 2>&1 ||
  fail "pip check: $(cat "$tmp/pip_check.log")"

# 3. The floors are the ones the generated stubs check at import (not higher, not lower). From
# $tmp with -I, so only the venv's meshrun can be imported, never the checkout's python/.
cd "$tmp"
"$tmp/venv/bin/python" -I - "$floors" <<'EOF' || fail "the declared floors and the stubs differ"
import glob, os, re, sys
from importlib.metadata import version
floors = dict(f.split("==") for f in sys.argv[1].split())
for name in ("grpcio", "protobuf", "numpy"):
    assert version(name) == floors[name], f"{name} {version(name)} installed, floor {floors[name]}"
import meshrun  # noqa: E402  the stubs' version checks run here
here = os.path.dirname(meshrun.__file__)
assert here.startswith(sys.prefix), f"meshrun imported from {here}, not the venv {sys.prefix}"
grpc_stamp = {re.search(r"GRPC_GENERATED_VERSION = '([0-9.]+)'", open(f).read()).group(1)
              for f in glob.glob(os.path.join(here, "v1", "*_pb2_grpc.py"))}
pb_stamp = {".".join(re.search(r"ValidateProtobufRuntimeVersion\(\s*[\w.]+,\s*(\d+),\s*(\d+),"
                               r"\s*(\d+),", open(f).read()).groups())
            for f in glob.glob(os.path.join(here, "v1", "*_pb2.py"))}
bad = [f"{n}: stubs need {s}, python/pyproject.toml declares >={floors[n]}"
       for n, s in (("grpcio", grpc_stamp), ("protobuf", pb_stamp)) if s != {floors[n]}]
sys.exit("; ".join(bad) + " (set the floors to what the stubs need)" if bad else 0)
EOF

# 4. A real job through that venv's Client: a coordinator and one 1-device worker (dp1 bundle).
"$bin/meshrun-coordinator" --listen=127.0.0.1:0 --state_dir="$tmp/coordinator" \
  >"$tmp/coordinator.log" 2>&1 &
pids+=($!)
await_coordinator "$tmp/coordinator.log"
"$bin/meshrun-worker" "$(worker_data_root)" --listen=127.0.0.1:0 \
  --coordinator="127.0.0.1:$port" --host=worker-0 --worker_index=0 \
  --state_dir="$tmp/worker-0" --cpu_devices=1 >"$tmp/worker-0.log" 2>&1 &
pids+=($!)
"$tmp/venv/bin/python" -I - "127.0.0.1:$port" "$bundle" >"$tmp/job.log" 2>&1 <<'EOF' ||
import math, sys, time
import meshrun
from meshrun.v1 import job_pb2
address, bundle = sys.argv[1:]
steps = 20
with meshrun.Client(address, timeout=10) as client:
    deadline = time.monotonic() + 30
    while not client.workers():
        assert time.monotonic() < deadline, "the worker did not register in 30 s"
        time.sleep(0.2)
    job = client.submit(bundle, steps=steps, cadence=5)
    manifest = client.wait(job, timeout=120)
    state = job_pb2.JobState.Name(manifest.state)
    assert state == "JOB_STATE_SUCCEEDED", f"{job} ended {state}: {manifest.error}"
    # Every series the job declared (whatever the series are named), at cadence 5.
    rows = client.export(job, as_dataframe=False)
    series = sorted({r["name"] for r in rows})
    declared = len(manifest.spec.telemetry)
    assert declared and len(series) >= declared, f"series {series}, {declared} declared"
    assert max(r["step"] for r in rows) == steps, f"last step {max(r['step'] for r in rows)}"
    assert all(math.isfinite(r["value"]) for r in rows), "non-finite telemetry"
    print(f"{job} SUCCEEDED, {len(rows)} telemetry rows of {series}")
EOF
  fail "the job through the wheel's Client: $(cat "$tmp/job.log")"
cat "$tmp/job.log"

# 5. The sdist alone builds a wheel (pip's isolated build: setuptools, pinned grpcio-tools) in
# another fresh venv, with the same files as the script's wheel.
"$host_python" -m venv "$tmp/venv2" || fail "second venv"
"$tmp/venv2/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-input --no-deps \
  -w "$tmp/from_sdist" "$sdist" >"$tmp/sdist.log" 2>&1 ||
  fail "the sdist did not build: $(tail -30 "$tmp/sdist.log")"
"$tmp/venv2/bin/python" - "$wheel" "$tmp"/from_sdist/meshrun-*.whl <<'EOF' ||
import sys, zipfile
a, b = (sorted(n for n in zipfile.ZipFile(w).namelist() if "dist-info" not in n)
        for w in sys.argv[1:])
assert a == b, f"the sdist's wheel differs: {sorted(set(a) ^ set(b))}"
EOF
  fail "the sdist's wheel"
echo "PASS: wheel at floors ($floors) ran a job; sdist builds"
