"""Writes checkpoints with JAX and orbax.checkpoint themselves, for meshrun to read
(checkpoint/orbax_read.h, docs/checkpoints.md).

  orbax_written.py values <dir>
      <dir>/3: PyTreeCheckpointHandler(use_ocdbt=False) with Orbax's default zstd compression:
      params.w f32 [4, 6] = 0.5 * i sharded over two CPU devices (two chunks), params.half bf16
      [8] = 0.25 * i - 1, step s32 = 7. <dir>/ocdbt: the same tree with OCDBT on (which meshrun
      refuses by name).
  orbax_written.py mlp <dir> <steps> <more>
      JAX trains examples/mlp_classifier <steps> steps and saves the state with
      PyTreeCheckpointHandler(use_ocdbt=False) in <dir>/<steps>, as a user fine-tuning elsewhere
      would; then prints "step,loss" for <more> further steps from that state, taking the
      bundle's batches from the first, as a job resumed from it does (an Orbax checkpoint holds
      no data position).
"""
import os
import sys

if sys.argv[1:2] == ["mlp"]:  # checkpoint_check imports export_examples: 8 CPU devices
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import checkpoint_check as check
else:
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                               " --xla_force_host_platform_device_count=2")

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp


def values(root):
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:2]), ("model",))
    split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(None, "model"))
    tree = {
        "params": {
            "w": jax.device_put(jnp.arange(24, dtype=jnp.float32).reshape(4, 6) * 0.5, split),
            "half": (jnp.arange(8, dtype=jnp.float32) * 0.25 - 1).astype(jnp.bfloat16),
        },
        "step": jnp.int32(7),
    }
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)).save(
        os.path.join(root, "3"), tree, force=True)
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=True)).save(
        os.path.join(root, "ocdbt"), tree, force=True)
    return 0


def mlp(root, steps, more):
    state, _ = check.jax_mlp_state(steps)
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)).save(
        os.path.join(root, str(steps)), state, force=True)
    step = jax.jit(check.ex.make_step(check.ex.Mlp()), donate_argnums=(0,))
    batches = check.ex.Mlp().data(check.ex.STEPS)
    print("step,loss")
    for s in range(more):
        state, metrics = step(state, jax.tree.map(jnp.asarray, batches[s % len(batches)]))
        print(f"{steps + 1 + s},{float(metrics['loss']):.9g}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "values":
        sys.exit(values(sys.argv[2]))
    if len(sys.argv) == 5 and sys.argv[1] == "mlp":
        sys.exit(mlp(sys.argv[2], int(sys.argv[3]), int(sys.argv[4])))
    print(__doc__)
    sys.exit(2)
