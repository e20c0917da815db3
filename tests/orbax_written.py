"""Writes checkpoints with JAX and orbax.checkpoint themselves, for meshrun to read
(checkpoint/orbax_read.h, docs/checkpoints.md).

  orbax_written.py values <dir>
      <dir>/3: PyTreeCheckpointHandler(use_ocdbt=False) with Orbax's default zstd compression:
      params.w f32 [4, 6] = 0.5 * i sharded over two CPU devices (two chunks), params.half bf16
      [8] = 0.25 * i - 1, step s32 = 7. <dir>/ocdbt: the same tree with OCDBT on (which meshrun
      refuses by name).
"""
import os
import sys

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"

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


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "values":
        sys.exit(values(sys.argv[2]))
    print(__doc__)
    sys.exit(2)
