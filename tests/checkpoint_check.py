"""Reads meshrun checkpoints with the JAX ecosystem's own readers (docs/checkpoints.md).

  checkpoint_check.py values <step dir>
      orbax.checkpoint restores the arrays checkpoint_test.cc wrote (f32 sharded over two
      chunks, bf16, an s32 scalar) with no meshrun code; their values follow its formulas.
  checkpoint_check.py mlp <step dir> <steps>
      orbax.checkpoint restores a meshrun checkpoint of examples/mlp_classifier after <steps>
      steps, into the state pytree sharded on JAX's own mesh, and tensorstore opens each leaf;
      both equal JAX's own state after the same steps (its init, its step, the bundle's
      batches) within 1e-5 relative.
Exits 0 when everything matches, 1 naming the first difference.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import export_examples as ex  # sets the 8-CPU-device XLA flags before JAX loads

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts


def restore_numpy(step_dir, tree):
    """Orbax restore of every leaf of `tree` as numpy (no sharding needed)."""
    checkpointer = ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False))
    args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), tree)
    return checkpointer.restore(step_dir, args=ocp.args.PyTreeRestore(restore_args=args))


def check_values(step_dir):
    got = restore_numpy(step_dir, {"params": {"w": 0, "half": 0}, "step": 0})
    w = np.arange(24, dtype=np.float32).reshape(4, 6) * 0.5
    half = (np.arange(8, dtype=np.float32) * 0.25 - 1).astype(ml_dtypes.bfloat16)
    checks = [("params.w", got["params"]["w"], w), ("params.half", got["params"]["half"], half),
              ("step", got["step"], np.int32(7))]
    for name, value, want in checks:
        if value.dtype != want.dtype or value.shape != want.shape or not np.array_equal(value, want):
            print(f"FAIL {name}: {value.dtype}{value.shape} {value} != {want.dtype}{want.shape} {want}")
            return 1
    print("ok: orbax restored f32, bf16 and s32 exactly")
    return 0


def jax_mlp_state(steps):
    model = ex.Mlp()
    mesh = ex.make_mesh(4, 2)
    specs = {"params": model.param_specs(mesh), "opt": ex.opt_specs(model.param_specs(mesh))}
    shardings = jax.tree.map(lambda s: jax.sharding.NamedSharding(mesh, s), specs,
                             is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec))
    init = jax.jit(model.init, out_shardings=shardings)
    step = jax.jit(ex.make_step(model), donate_argnums=(0,))
    state = init(jnp.asarray(ex.SEED, jnp.uint32))
    batches = model.data(ex.STEPS)  # the bundle's batches, cycled by the worker
    for s in range(steps):
        state, _ = step(state, jax.tree.map(jnp.asarray, batches[s % len(batches)]))
    return state, shardings


def close(name, got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    if got.shape != want.shape:
        print(f"FAIL {name}: shape {got.shape} != {want.shape}")
        return False
    # Relative to the array's largest magnitude: the two XLA builds (the plugin's and jaxlib's)
    # may round an element near zero differently in its last bits.
    scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1e-12)
    worst = float(np.max(np.abs(got - want))) / scale if got.size else 0.0
    if worst > 1e-5:
        print(f"FAIL {name}: differs from JAX's by {worst:.3g} relative")
        return False
    return True


def check_mlp(step_dir, steps):
    want, shardings = jax_mlp_state(steps)
    # orbax, into the state pytree with JAX's shardings (what a user restoring writes).
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                          want, shardings)
    restored = ocp.StandardCheckpointer().restore(step_dir, target)
    flat_want = jax.tree_util.tree_flatten_with_path(want)[0]
    flat_got = dict(jax.tree_util.tree_flatten_with_path(restored)[0])
    for path, value in flat_want:
        name = ".".join(str(getattr(k, "key", k)) for k in path)
        if not close(f"orbax {name}", flat_got[path], value):
            return 1
        opened = ts.open({"driver": "zarr", "kvstore": {"driver": "file",
                                                        "path": os.path.join(step_dir, name)}},
                         open=True).result()
        if not close(f"tensorstore {name}", opened.read().result(), value):
            return 1
    print(f"ok: {len(flat_want)} arrays equal JAX's state after {steps} steps (orbax, tensorstore)")
    return 0


def main(argv):
    if len(argv) >= 3 and argv[1] == "values":
        return check_values(argv[2])
    if len(argv) >= 4 and argv[1] == "mlp":
        return check_mlp(argv[2], int(argv[3]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
