"""meshrun's TPU executable against JAX's: for each program of a bundle, the optimized HLO that
`meshrun compile --target=... --hlo_out=DIR` produced through meshrun's C API path must equal
the one JAX's ahead-of-time compile (jax.experimental.topologies, the compile-only client)
produces for the same StableHLO, compile options and topology. The module's name line differs
by construction and is left out. Usage: fidelity_check.py <bundle dir> <hlo dir> <topology>
<chips_per_host_bounds as 2,4,1> <libtpu.so>; exits 1 naming the first program that differs."""
import json
import os
import sys


def hlo_module_of(optimized):
    """PJRT_Executable_OptimizedProgram hands an HloModuleProtoWithConfig: its field 1 is the
    HloModuleProto (a length-delimited field: tag 0x0a, varint length, bytes)."""
    if optimized[:1] != b"\x0a":
        return optimized
    length, shift, i = 0, 0, 1
    while True:
        byte = optimized[i]
        length |= (byte & 0x7F) << shift
        shift, i = shift + 7, i + 1
        if byte < 0x80:
            break
    return optimized[i:i + length]


def main(bundle, hlo_dir, topology, bounds, libtpu):
    os.environ["TPU_LIBRARY_PATH"] = libtpu
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ["JAX_PLATFORMS"] = "cpu"
    from jax.experimental import topologies
    from jax._src.interpreters import mlir
    from jax._src.lib import _jax, xla_client
    from jax._src.lib.mlir import ir

    topo = topologies.get_topology_desc(
        topology_name=topology, platform="tpu",
        chips_per_host_bounds=tuple(int(b) for b in bounds.split(",")))
    with open(os.path.join(hlo_dir, "compile_options.pb"), "rb") as f:
        options = xla_client.CompileOptions.ParseFromString(f.read())
    with open(os.path.join(bundle, "job.json")) as f:
        job = json.load(f)
    by_id = {d.id: d for d in topo.devices}
    devices = xla_client.DeviceList(tuple(by_id[i] for i in job["mesh"]["device_ids"]))
    client = topo.devices[0].client
    compared = []
    for role, program in sorted(job["programs"].items()):
        with open(os.path.join(bundle, program["file"]), "rb") as f:
            text = xla_client._xla.mlir.deserialize_portable_artifact(f.read())
        with mlir.make_ir_context():  # what jax.jit(...).lower(...).compile() hands the client
            module = ir.Module.parse(text)
            jax_text = client.compile(module, devices, options).hlo_modules()[0].to_string()
        with open(os.path.join(hlo_dir, f"{role}.hlo.pb"), "rb") as f:
            optimized = f.read()
        try:
            ours = _jax.HloModule.from_serialized_hlo_module_proto(hlo_module_of(optimized))
        except Exception:  # a plugin that hands the bare HloModuleProto
            ours = _jax.HloModule.from_serialized_hlo_module_proto(optimized)
        ours = ours.to_string()
        body = lambda text: text.split("\n", 1)[1]  # noqa: E731 (after "HloModule <name>, ...")
        if body(jax_text) != body(ours):
            a, b = body(jax_text).splitlines(), body(ours).splitlines()
            first = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            print(f"program {role}: meshrun's optimized HLO differs from JAX's at line {first + 2}:"
                  f"\n  jax:     {a[first] if first < len(a) else '<end>'}"
                  f"\n  meshrun: {b[first] if first < len(b) else '<end>'}")
            return 1
        compared.append(f"{role} ({len(a := body(ours).splitlines())} lines)")
    print(f"same optimized HLO as JAX for {topology}: {', '.join(compared)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
