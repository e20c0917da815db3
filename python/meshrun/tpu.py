"""meshrun.tpu: what a bundle needs of a TPU slice, found on any machine with libtpu (no TPU):
each program compiled for the target's topology by JAX's ahead-of-time path, the same compile
`meshrun compile --target=...` does through the PJRT C API (docs/pjrt.md).

    report = meshrun.tpu.check_fit("bundle/", "v6e-8")   # raises DoesNotFitError
    meshrun.export.export(..., target="v6e-8")           # the same, right after export

libtpu comes from $TPU_LIBRARY_PATH, else the `libtpu` package; without either the check
raises RuntimeError naming both. Targets: <generation>-<chips> and <n>x<generation>-<chips>
(v6e-8, v6e-16, 2xv6e-8; generations v5e and v6e), as runtime/compile_target.h."""
import json
import os
import re

import numpy as np

from meshrun.errors import DoesNotFitError

GIB = 1 << 30
# Per chip: HBM and dense bf16 FLOP/s, the vendor's figures.
CHIPS = {"v5e": (16 * GIB, 197e12), "v6e": (32 * GIB, 918e12)}
SHAPES = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
          256: "16x16"}


def parse_target(target):
    """(generation, chips per slice, slices, topology name, chips_per_host_bounds)."""
    m = re.fullmatch(r"(?:(\d+)x)?(v5e|v6e)-(\d+)", target or "")
    if not m or int(m.group(3)) not in SHAPES or (m.group(1) and int(m.group(1)) < 1):
        raise ValueError(f"target {target!r}: a compile target is <generation>-<chips> or "
                         f"<slices>x<generation>-<chips> (v6e-8, v6e-16, 2xv6e-8; generations "
                         f"v5e, v6e; chips {', '.join(map(str, SHAPES))})")
    slices, generation, chips = int(m.group(1) or 1), m.group(2), int(m.group(3))
    per_host = chips if chips <= 8 else 4
    bounds = {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}[per_host]
    return generation, chips, slices, f"{generation}:{SHAPES[chips]}", bounds


def _libtpu():
    path = os.environ.get("TPU_LIBRARY_PATH")
    if path:
        return path
    try:
        import libtpu  # noqa: F401  (the package JAX's TPU support installs)
        return libtpu.get_library_path()
    except ImportError:
        raise RuntimeError("compiling for a TPU target needs libtpu: pip install "
                           "\"libtpu==0.0.30.*\", or set TPU_LIBRARY_PATH to a libtpu.so")


def check_fit(bundle_dir, target):
    """Compiles each program of the bundle for `target`; returns {"target", "programs": {role:
    {"device_bytes", "flops_per_device", ...}}}. Raises DoesNotFitError (naming the program
    and both sizes) when one does not fit a chip, ValueError for an unknown target or a mesh
    larger than the target."""
    generation, chips, slices, topology, bounds = parse_target(target)
    hbm, _ = CHIPS[generation]
    os.environ["TPU_LIBRARY_PATH"] = _libtpu()
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    from jax.experimental import topologies
    from jax._src.interpreters import mlir
    from jax._src.lib import xla_client
    from jax._src.lib.mlir import ir

    with open(os.path.join(bundle_dir, "job.json")) as f:
        job = json.load(f)
    ids = job["mesh"]["device_ids"]
    if len(ids) > chips * slices:
        raise ValueError(f"the bundle's mesh has {len(ids)} devices; {target} has "
                         f"{chips * slices}: export the job for this target's device count")
    topo = topologies.get_topology_desc(topology_name=topology, platform="tpu",
                                        chips_per_host_bounds=bounds,
                                        **({"num_slices": slices} if slices > 1 else {}))
    devices = sorted(topo.devices, key=lambda d: d.id)
    per_slice = len(ids) // slices if len(ids) % slices == 0 else len(ids)
    chosen = [d for s in range(slices) for d in devices[s * chips:(s * chips) + per_slice]]
    chosen = chosen[:len(ids)]
    options = xla_client.CompileOptions()
    build = options.executable_build_options
    build.num_replicas, build.num_partitions = 1, len(chosen)
    build.use_spmd_partitioning = True
    build.use_shardy_partitioner = True  # meshrun.export lowers for Shardy, as JAX does
    build.device_assignment = xla_client.DeviceAssignment.create(
        np.array([[d.id for d in chosen]], dtype=np.int32))  # 1 replica x n partitions
    client = devices[0].client
    report = {"target": target, "programs": {}}
    for role, program in job["programs"].items():
        with open(os.path.join(bundle_dir, program["file"]), "rb") as f:
            text = xla_client._xla.mlir.deserialize_portable_artifact(f.read())
        with mlir.make_ir_context():
            try:
                compiled = client.compile(ir.Module.parse(text),
                                          xla_client.DeviceList(tuple(chosen)), options)
            except Exception as e:  # XLA:TPU's own fit check: "Used 32.00G of 31.25G hbm"
                if "Ran out of memory in memory space hbm" not in str(e):
                    raise
                first = next(line for line in str(e).splitlines() if "hbm" in line)
                raise DoesNotFitError(f"program {role} does not fit one {generation} chip's "
                                      f"HBM ({hbm / GIB:.2f} GiB): {first.strip()}") from None
        memory = compiled.get_compiled_memory_stats()
        needs = (memory.argument_size_in_bytes + memory.output_size_in_bytes -
                 memory.alias_size_in_bytes + memory.temp_size_in_bytes +
                 memory.generated_code_size_in_bytes)
        cost = compiled.cost_analysis() or {}
        cost = cost[0] if isinstance(cost, list) else cost
        report["programs"][role] = {"device_bytes": needs, "flops_per_device": cost.get("flops"),
                                    "argument_bytes": memory.argument_size_in_bytes,
                                    "output_bytes": memory.output_size_in_bytes,
                                    "temp_bytes": memory.temp_size_in_bytes}
        if needs > hbm:
            raise DoesNotFitError(
                f"program {role} needs {needs / GIB:.2f} GiB per device; a {generation} chip "
                f"has {hbm / GIB:.2f} GiB of HBM: shard the state over more devices or shrink "
                f"the batch")
    return report
