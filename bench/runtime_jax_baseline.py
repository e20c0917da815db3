#!/usr/bin/env python3
"""JAX side of meshrun_runtime_step_bench: the same train steps as
examples/<model>/<mesh>/step.mlirbc (built by examples/export_examples.py), jitted by JAX and
driven from Python on the same 8 CPU devices, state donated, batches already on device.

Models: "small" = the MLP classifier (a short, dispatch-bound step), "lm" = the transformer LM.
It compiles both, runs 3 warm-up steps of each, prints "compile_s_<model> <v>" for each and
"ready", then serves the benchmark on stdin so that its rounds can alternate with meshrun's:
  run <model> <steps>   ->  "elapsed <seconds> thread_cpu <s> process_cpu <s>"  (dispatch of
                            `steps` steps until the last is done; the CPU of the Python thread
                            that dispatches, and of the whole process with XLA's threads)
  quit
Exit 77 when JAX is missing.
  .venv/bin/python bench/runtime_jax_baseline.py [--mesh dp8]
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

MODELS = {"small": ex.Mlp, "lm": ex.TransformerLm}


class Runner:
    def __init__(self, model, mesh_name, warmup):
        dp, tp = ex.MESHES[mesh_name]
        mesh = ex.make_mesh(dp, tp)
        named = lambda specs: jax.tree.map(lambda s: NamedSharding(mesh, s), specs,
                                           is_leaf=lambda x: isinstance(x, P))
        param_specs = model.param_specs(mesh)
        state_shardings = named({"params": param_specs, "opt": ex.opt_specs(param_specs)})
        batch_shardings = named(model.batch_specs(mesh))
        replicated = NamedSharding(mesh, P())
        seed = jnp.asarray(ex.SEED, jnp.uint32)
        init = jax.jit(model.init, in_shardings=replicated, out_shardings=state_shardings)
        self.batches = [jax.device_put(b, batch_shardings) for b in model.data(ex.STEPS)]
        step_fn = ex.make_step(model)
        _, metric_shapes = jax.eval_shape(step_fn, jax.eval_shape(model.init, seed),
                                          self.batches[0])
        step = jax.jit(step_fn, in_shardings=(state_shardings, batch_shardings),
                       out_shardings=(state_shardings,
                                      jax.tree.map(lambda _: replicated, metric_shapes)),
                       donate_argnums=(0,))
        self.state = init(seed)
        start = time.perf_counter()
        self.compiled = step.lower(self.state, self.batches[0]).compile()
        self.compile_s = time.perf_counter() - start
        self.index = 0
        self.run(warmup)

    def run(self, steps):
        """Dispatches `steps` steps as a JAX user's loop does; returns the seconds until done and
        the CPU seconds of this thread and of the process over them."""
        thread_start, process_start = time.thread_time(), time.process_time()
        start = time.perf_counter()
        metrics = None
        for _ in range(steps):
            self.state, metrics = self.compiled(self.state,
                                                self.batches[self.index % len(self.batches)])
            self.index += 1
        jax.block_until_ready((self.state, metrics))
        return (time.perf_counter() - start, time.thread_time() - thread_start,
                time.process_time() - process_start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mesh", default="dp8", choices=sorted(ex.MESHES))
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    runners = {name: Runner(cls(), args.mesh, args.warmup) for name, cls in MODELS.items()}
    for name, runner in runners.items():
        print(f"compile_s_{name} {runner.compile_s:.6f}")
    print("ready", flush=True)
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        if words[0] != "run" or len(words) != 3 or words[1] not in runners:
            print(f"error: bad command {line.strip()!r}", flush=True)
            return 2
        elapsed, thread_cpu, process_cpu = runners[words[1]].run(int(words[2]))
        print(f"elapsed {elapsed:.9f} thread_cpu {thread_cpu:.9f} process_cpu {process_cpu:.9f}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
