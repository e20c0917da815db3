"""Writes a bundle whose model cannot fit a v6e chip: one replicated f32 weight of 32 GiB
(8192 x 1048576), trained by SGD on the MLP example's batches. Only lowered (never run), so it
needs no memory here. Usage: too_large_bundle.py <out_dir> <examples dir>."""
import json
import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from meshrun._lowering import portable_artifact  # noqa: E402

ROWS, COLS = 8192, 1 << 20


def main(out_dir, examples):
    os.makedirs(out_dir, exist_ok=True)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
    rep = NamedSharding(mesh, P())
    rows = NamedSharding(mesh, P("data"))
    w = jax.ShapeDtypeStruct((ROWS, COLS), jnp.float32, sharding=rep)

    def init(seed):
        del seed
        return jnp.zeros((ROWS, COLS), jnp.float32)

    def step(w, label, x):
        def loss_fn(w):
            h = x @ w[:16, :64]
            return jnp.mean((h - label[:, None].astype(jnp.float32)) ** 2) + 1e-9 * jnp.sum(w)
        loss, g = jax.value_and_grad(loss_fn)(w)
        return w - 0.1 * g, loss

    seed = jax.ShapeDtypeStruct((), jnp.uint32, sharding=rep)
    label = jax.ShapeDtypeStruct((32,), jnp.int32, sharding=rows)
    x = jax.ShapeDtypeStruct((32, 16), jnp.float32, sharding=NamedSharding(mesh, P("data", None)))
    init_code, _ = portable_artifact(jax.jit(init, out_shardings=rep), (seed,))
    step_code, _ = portable_artifact(
        jax.jit(step, out_shardings=(rep, rep), donate_argnums=(0,)), (w, label, x))
    for name, code in (("init.mlirbc", init_code), ("step.mlirbc", step_code)):
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(code)

    def entry(name, dtype, shape, sharding, shard_shape):
        return {"name": name, "dtype": dtype, "shape": shape, "sharding": sharding,
                "shard_shape": shard_shape}
    weight = entry("state.params.w", "f32", [ROWS, COLS], [None, None], [ROWS, COLS])
    label_e = entry("batch.label", "s32", [32], ["data"], [4])
    x_e = entry("batch.x", "f32", [32, 16], ["data", None], [4, 16])
    loss = entry("metrics.loss", "f32", [], [], [])
    job = {
        "name": "too_large/dp8", "model_family": "dense",
        "mesh": {"axes": ["data"], "shape": [8], "device_ids": list(range(8))},
        "programs": {
            "init": {"file": "init.mlirbc", "format": "mlir",
                     "inputs": [entry("seed", "u32", [], [], [])], "outputs": [weight],
                     "donated_inputs": []},
            "step": {"file": "step.mlirbc", "format": "mlir",
                     "inputs": [weight, label_e, x_e], "outputs": [weight, loss],
                     "donated_inputs": [0]}},
        "seed": 0,
        "data": {"file": os.path.relpath(os.path.join(examples, "mlp_classifier", "data.bin"), out_dir),
                 "steps": 20, "arrays": [label_e, x_e]},
        "telemetry": [{"name": "loss", "output": "metrics.loss", "shape": [], "combine": "mean"}],
    }
    with open(os.path.join(out_dir, "job.json"), "w") as f:
        json.dump(job, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
