#!/usr/bin/env python3
"""JAX side of meshrun_runtime_step_bench: the same transformer train step as
examples/transformer_lm/<mesh>/step.mlirbc (built by examples/export_examples.py), jitted by JAX
and driven from Python on the same 8 CPU devices, state donated, batches already on device.

Prints "compile_s <v>" and "steps_per_s <v>". Exit 77 when JAX is missing.
  .venv/bin/python bench/runtime_jax_baseline.py [--mesh dp8] [--steps 30] [--warmup 3]
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import export_examples as ex  # sets XLA_FLAGS / JAX_PLATFORMS before JAX loads; exits 77 without JAX

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mesh", default="dp8", choices=sorted(ex.MESHES))
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    model = ex.TransformerLm()
    dp, tp = ex.MESHES[args.mesh]
    mesh = ex.make_mesh(dp, tp)
    named = lambda specs: jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                       is_leaf=lambda x: isinstance(x, P))
    param_specs = model.param_specs(mesh)
    state_shardings = named({"params": param_specs, "opt": ex.opt_specs(param_specs)})
    batch_shardings = named(model.batch_specs(mesh))
    replicated = NamedSharding(mesh, P())
    seed = jnp.asarray(ex.SEED, jnp.uint32)
    init = jax.jit(model.init, in_shardings=replicated, out_shardings=state_shardings)
    batches = [jax.device_put(b, batch_shardings) for b in model.data(ex.STEPS)]
    step_fn = ex.make_step(model)
    _, metric_shapes = jax.eval_shape(step_fn, jax.eval_shape(model.init, seed), batches[0])
    step = jax.jit(step_fn, in_shardings=(state_shardings, batch_shardings),
                   out_shardings=(state_shardings, jax.tree.map(lambda _: replicated, metric_shapes)),
                   donate_argnums=(0,))

    state = init(seed)
    start = time.perf_counter()
    compiled = step.lower(state, batches[0]).compile()
    print(f"compile_s {time.perf_counter() - start:.6f}")
    for i in range(args.warmup):
        state, metrics = compiled(state, batches[i % len(batches)])
    jax.block_until_ready(state)
    start = time.perf_counter()
    for i in range(args.steps):
        state, metrics = compiled(state, batches[i % len(batches)])
    jax.block_until_ready((state, metrics))
    elapsed = time.perf_counter() - start
    print(f"steps_per_s {args.steps / elapsed:.6f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
