"""TPU compile benchmarks (docs/pjrt.md), on any host with libtpu; no TPU needed.

  .venv/bin/python bench/tpu_compile_bench.py [--rounds 5] [--bin build/bin] [--libtpu PATH]

1. tpu_compile_vs_jax: the LM (examples/transformer_lm/dp4_tp2, init + step) compiled for
   v6e-8 by `meshrun compile` (the C API path: PJRT_TopologyDescription_Create + PJRT_Compile)
   against JAX's ahead-of-time compile of the same StableHLO with the same compile options for
   the same topology (jax.experimental.topologies, the compile-only client), alternating round
   by round; ratio = JAX's seconds / meshrun's (higher: meshrun faster). Both sides count the
   compiles alone, after their libtpu is loaded.
2. tpu_cache_hit_vs_compile: a coordinator with --tpu_compiler_plugin launching the LM on a
   stand-in v6e-8 host (tests/tpu/fake_tpu_host.py): submit -> StartJob when it compiles,
   against submit -> StartJob when the executable comes from its cache and is streamed to a
   new host that lacks it. Ratio = compile / cache hit; goal >= 20.
The last line is `ratio tpu_cache_hit_vs_compile ...`; the compile ratio is printed above it."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "tpu"))
BUNDLE = os.path.join(ROOT, "examples", "transformer_lm", "dp4_tp2")

JAX_SIDE = r'''
import json, os, sys, time
os.environ["JAX_PLATFORMS"] = "cpu"
from jax.experimental import topologies
from jax._src.interpreters import mlir
from jax._src.lib import xla_client
from jax._src.lib.mlir import ir
bundle, options_path = sys.argv[1], sys.argv[2]
topo = topologies.get_topology_desc(topology_name="v6e:2x4", platform="tpu",
                                    chips_per_host_bounds=(2, 4, 1))
options = xla_client.CompileOptions.ParseFromString(open(options_path, "rb").read())
job = json.load(open(os.path.join(bundle, "job.json")))
by_id = {d.id: d for d in topo.devices}
devices = xla_client.DeviceList(tuple(by_id[i] for i in job["mesh"]["device_ids"]))
client = topo.devices[0].client
seconds = 0.0
for role in ("init", "step"):
    text = xla_client._xla.mlir.deserialize_portable_artifact(
        open(os.path.join(bundle, job["programs"][role]["file"]), "rb").read())
    with mlir.make_ir_context():
        module = ir.Module.parse(text)
        start = time.perf_counter()
        client.compile(module, devices, options)
        seconds += time.perf_counter() - start
print(seconds)
'''


def spread(values):
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return (f"median {statistics.median(values):.3f} (IQR {q[0]:.3f}..{q[2]:.3f}, "
            f"min {min(values):.3f}, max {max(values):.3f}, {len(values)} rounds)")


def meshrun_compile(bin_dir, libtpu, hlo_dir):
    out = subprocess.run([os.path.join(bin_dir, "meshrun"), "--output=json", "compile", BUNDLE,
                          "--target=v6e-8", f"--compiler_plugin={libtpu}",
                          f"--hlo_out={hlo_dir}"], capture_output=True, text=True, check=True)
    return sum(p["compile_seconds"] for p in json.loads(out.stdout)["programs"])


def jax_compile(libtpu, options_path):
    env = dict(os.environ, TPU_LIBRARY_PATH=libtpu, TPU_SKIP_MDS_QUERY="1",
               ALLOW_MULTIPLE_LIBTPU_LOAD="1")
    out = subprocess.run([sys.executable, "-c", JAX_SIDE, BUNDLE, options_path],
                         capture_output=True, text=True, check=True, env=env)
    return float(out.stdout.split()[-1])


def compile_ratio(bin_dir, libtpu, rounds, tmp):
    meshrun_compile(bin_dir, libtpu, tmp)  # writes the options JAX compiles with; warms caches
    options = os.path.join(tmp, "compile_options.pb")
    ratios, ours, theirs = [], [], []
    for r in range(rounds):
        if r % 2 == 0:
            a = meshrun_compile(bin_dir, libtpu, tmp)
            b = jax_compile(libtpu, options)
        else:
            b = jax_compile(libtpu, options)
            a = meshrun_compile(bin_dir, libtpu, tmp)
        ours.append(a)
        theirs.append(b)
        ratios.append(b / a)
    print(f"LM for v6e-8, init + step: meshrun {spread(ours)} s; JAX AOT {spread(theirs)} s")
    return ratios


def cache_ratio(bin_dir, libtpu, rounds, tmp):
    from coordinator_compile_check import start_coordinator
    from fake_tpu_host import serve_v6e8_host, sha256_of
    sha = sha256_of(libtpu)
    compiled, served, ratios = [], [], []
    for r in range(rounds):
        state = tempfile.mkdtemp(dir=tmp)
        coordinator, address = start_coordinator(bin_dir, state, libtpu)
        try:
            times = []
            for attempt in range(2):  # a compile, then a cache hit for a new host
                host, stop = serve_v6e8_host(address, f"tpu-host-{r}-{attempt}", sha)
                start = time.monotonic()
                job = subprocess.run([os.path.join(bin_dir, "meshrun"),
                                      f"--coordinator={address}", "submit", BUNDLE,
                                      "--steps=10"], capture_output=True, text=True,
                                     check=True).stdout.strip()
                deadline = time.monotonic() + 240
                while job not in host.started_at:
                    assert time.monotonic() < deadline, f"{job} never started"
                    time.sleep(0.01)
                times.append(host.started_at[job] - start)
                subprocess.run([os.path.join(bin_dir, "meshrun"), f"--coordinator={address}",
                                "cancel", job], capture_output=True, check=True)
                stop()
        finally:
            coordinator.terminate()
            coordinator.wait(timeout=30)
        compiled.append(times[0])
        served.append(times[1])
        ratios.append(times[0] / times[1])
    print(f"LM v6e-8 submit -> StartJob: compiled {spread(compiled)} s; "
          f"from the cache to a new host {spread(served)} s")
    return ratios


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    parser.add_argument("--libtpu", default=os.path.join(ROOT, ".deps", "libtpu", "0.0.30",
                                                         "libtpu.so"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        compile_ratios = compile_ratio(args.bin, args.libtpu, args.rounds, tmp)
        print(f"tpu_compile_vs_jax: {spread(compile_ratios)}")
        print(f"ratio tpu_compile_vs_jax {statistics.median(compile_ratios):.3f}")
        hit_ratios = cache_ratio(args.bin, args.libtpu, args.rounds, tmp)
        print(f"tpu_cache_hit_vs_compile: {spread(hit_ratios)}")
        print(f"ratio tpu_cache_hit_vs_compile {statistics.median(hit_ratios):.3f}")


if __name__ == "__main__":
    main()
