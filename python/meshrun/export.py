"""meshrun.export: a JAX training step (compile mode A) or grad + apply (mode B) as a meshrun
bundle directory.

    meshrun.export.export(out_dir, init=init, step=step, mesh=mesh,
                          state_shardings=..., batch_shardings=..., example_batch=batch,
                          batches=[...], axis_roles={"rows": "data", "cols": "model"})

writes out_dir/{job.json, init.mlirbc, step.mlirbc, data.bin}: init(seed: u32[]) -> state and
step(state, batch) -> (state, metrics) as StableHLO (state donated, no source locations: the
same model exports the same bytes from any directory), the job file with each array's name,
dtype, global shape and sharding, one telemetry series per metrics leaf, and the batches
(meshrun.data.write_arrays format). `metrics` must hold a scalar "loss".

Mesh axes and roles: meshrun runs a mesh of (data, expert, model). An axis named data, model
or expert takes that role (the convention); any other name must be mapped by `axis_roles`, and
an unmapped name raises ValueError naming it. The mesh's axes must be in the order
data, expert, model and its devices in id order (jax.make_mesh's default)."""
import functools
import json
import os

import numpy as np

from meshrun._export_checks import (apply_metrics, checked_reference_series, dropped_message,
                                    step_metrics)
from meshrun._lowering import check_program, dropped_inputs, entries, portable_artifact
from meshrun.data import write_arrays

ROLES = ("data", "expert", "model")  # meshrun's mesh order (coordinator/mesh_planner.cc)
COMBINES = ("mean", "max", "min", "sum", "last")
_SEED_ENTRY = {"name": "seed", "dtype": "u32", "shape": [], "sharding": [], "shard_shape": []}


def resolve_axis_roles(axis_names, axis_roles=None):
    """{mesh axis name: role}. ValueError names an unmapped, unknown or repeated axis/role."""
    given = dict(axis_roles or {})
    out = {}
    for axis in axis_names:
        role = given.pop(axis, axis if axis in ROLES else None)
        if role is None:
            raise ValueError(f"mesh axis \"{axis}\" has no role: pass axis_roles="
                             f"{{\"{axis}\": \"data\" | \"model\" | \"expert\"}}")
        if role not in ROLES:
            raise ValueError(f"axis_roles[\"{axis}\"] = \"{role}\" is not data, model or expert")
        if role in out.values():
            raise ValueError(f"two mesh axes take the role \"{role}\"")
        out[axis] = role
    if given:
        raise ValueError(f"axis_roles names {sorted(given)}, which the mesh "
                         f"(axes {tuple(axis_names)}) does not have")
    order = [ROLES.index(r) for r in out.values()]
    if order != sorted(order):
        raise ValueError(f"mesh axes {tuple(axis_names)} (roles {tuple(out.values())}) must be "
                         "in the order data, expert, model")
    return out


def _write_program(out_dir, file, jitted, args, platforms, inputs, donated, extras=()):
    """Lowers `jitted` for `args` into out_dir/file; RuntimeError naming the `inputs` (job.json
    entries) the program left out, or a lost donation."""
    code, text = portable_artifact(jitted, args, platforms)
    names = [e["name"] for e in inputs]
    check_program(file, text, len(names), donated, lambda: dropped_message(
        file, names, dropped_inputs(jitted, args, platforms), extras))
    with open(os.path.join(out_dir, file), "wb") as f:
        f.write(code)


def _program(file, inputs, outputs, donated):
    return {"file": file, "format": "mlir", "inputs": inputs, "outputs": outputs,
            "donated_inputs": list(donated)}


def _telemetry(metric_entries, combine, default_combine, captions, series_order):
    """One declaration per metrics leaf, in `series_order` (default: the pytree's order)."""
    combine, captions = dict(combine or {}), dict(captions or {})
    by_series = {e["name"][len("metrics."):]: e for e in metric_entries}
    order = list(by_series) if series_order is None else list(series_order)
    if sorted(order) != sorted(by_series):
        raise ValueError(f"series_order {order} must name each metric once: "
                         f"{sorted(by_series)}")
    telemetry = []
    for series in order:
        entry = by_series[series]
        how = combine.pop(series, default_combine)
        if how not in COMBINES:
            raise ValueError(f"combine[\"{series}\"] = \"{how}\" is not one of {COMBINES}")
        declared = {"name": series, "output": entry["name"], "shape": entry["shape"],
                    "combine": how}
        if series in captions:
            declared["caption"] = captions.pop(series)
        telemetry.append(declared)
    for what, left in (("combine", combine), ("captions", captions)):
        if left:
            raise ValueError(f"{what} names {sorted(left)}, which the metrics do not have")
    return telemetry


def _host_rows(batch, host, hosts):
    """Host `host`'s rows of a global batch: [host*b, (host+1)*b) of each array's first dim."""
    import jax
    import jax.numpy as jnp

    def rows(x):
        if x.shape[0] % hosts:
            raise ValueError(f"a batch array's first dimension ({x.shape[0]}) does not split "
                             f"over host_replicas={hosts}")
        b = x.shape[0] // hosts
        return jnp.asarray(x[host * b:(host + 1) * b])
    return jax.tree.map(rows, batch)


def export(out_dir, *, init, step=None, mesh, state_shardings, batch_shardings, example_batch,
           batches=None, data_file="data.bin", seed=0, axis_roles=None, combine=None,
           default_combine="mean", name="model", model_family="dense", platforms=None,
           reference_steps=0, grad=None, apply=None, init_accumulator=None,
           accumulator_shardings=None, grad_accumulation=1, captions=None, series_order=None,
           extra_inputs=None, host_replicas=1, sparse_attention=None,
           reference_series=("loss",), compile_options_jax=None, keep_unused=False, target=None,
           vocab_size=None):
    """Writes the bundle; returns {"job": path to job.json, "reference_loss": [...],
    "reference": the reference.json contents or None, "target": meshrun.tpu.check_fit's report
    or None}. With `target` ("v6e-8", "2xv6e-16", ...) each program is compiled for that TPU
    slice through libtpu (no TPU needed) and DoesNotFitError is raised, the bundle kept, when
    one does not fit a chip.

    Compile mode A: `step(state, batch) -> (state, metrics)`, the state it returns with the
    init's leaves, dtypes and shapes (the next step takes it in place; a step or apply that
    changes one is refused here, naming the leaf).
    Compile mode B (instead of `step`): `grad(state, acc, batch) -> acc` runs on each of
    `grad_accumulation` micro-batches, then `apply(state, acc) -> (state, acc, metrics)` once
    (it must return the accumulator zeroed for the next step); `init_accumulator(state) -> acc`
    gives the accumulator's structure (its zeros start each run) and `accumulator_shardings` its
    shardings. `batches` are then micro-batches, grad_accumulation per step.

    state_shardings / batch_shardings: pytrees (matching the state and the batch) of
    PartitionSpec or NamedSharding on `mesh`. batches: the batches written to data.bin (default
    [example_batch]); data_file=None writes none (the job then trains on --data); a relative
    path such as "../data.bin" lets bundles share one file.
    combine: {metric leaf name: "mean"|"max"|"min"|"sum"|"last"} over hosts, others
    `default_combine`. captions: {metric leaf name: "rows × columns" caption} for 2-D series
    (the dashboard's heatmap). series_order: the metric leaf names in the order to declare them
    (default: the metrics pytree's order).
    extra_inputs (mode A): {name: (shardings, make)}: step inputs after the batch that the
    worker builds from each batch itself, e.g. block-sparse attention's plan tables (then also
    pass sparse_attention=, the JobBundle's contract, which names them "<name>.<leaf>"); the
    step is step(state, batch, *extras) and make(batch) gives an extra's arrays for the
    reference run.
    host_replicas (mode B): the mesh is one host's, and `host_replicas` hosts each run the
    programs on their rows of every global batch (host h takes rows [h*b, (h+1)*b)), averaging
    accumulators between grad and apply (docs/multihost_cpu.md); example_batch and batches are
    global.
    reference_steps > 0 also runs JAX itself on the batches (as the hosts would) and writes
    reference.json: backend, seed, steps, then the loss and each other scalar metric named in
    `reference_series`, per step (test data; meshrun does not need it). compile_options_jax: a
    path recorded in job.json for tests (JAX's own serialized CompileOptions); meshrun does not
    read it either.
    keep_unused (mode A): the step keeps inputs it does not read (e.g. a batch array it reads
    only through extra_inputs); off by default, as it also keeps dead code in the program. The
    worker feeds every input the job declares, so a program that dropped one is refused, named.
    Mode B's grad always keeps its inputs (it may read only part of the state).
    vocab_size (token models): the vocabulary batch.tokens index; token shards (--data) whose
    header declares a larger one are refused at submit rather than trained on."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    mode_b = _compile_mode_b(step, grad, apply, init_accumulator, accumulator_shardings,
                             grad_accumulation, extra_inputs, host_replicas)
    roles = resolve_axis_roles(mesh.axis_names, axis_roles)
    ids = _mesh_device_ids(mesh)
    to_named = lambda tree: jax.tree.map(
        lambda s: s if isinstance(s, NamedSharding) else NamedSharding(mesh, s), tree,
        is_leaf=lambda x: isinstance(x, (PartitionSpec, NamedSharding)))
    state_shardings = to_named(state_shardings)
    batch_shardings = to_named(batch_shardings)
    replicated = NamedSharding(mesh, PartitionSpec())
    extras = {k: (to_named(s), make) for k, (s, make) in (extra_inputs or {}).items()}
    extra_shardings = tuple(s for s, _ in extras.values())
    batches = [example_batch] if batches is None else list(batches)
    # What one host's programs see: all of it, or its rows of each global batch.
    host_batch = (lambda b, h: _host_rows(b, h, host_replicas)) if host_replicas > 1 else (
        lambda b, h: jax.tree.map(jnp.asarray, b))
    make_extras = lambda batch: tuple(jax.tree.map(jnp.asarray, make(batch))
                                      for _, make in extras.values())

    seed_value = jnp.asarray(seed, jnp.uint32)
    state_shapes = jax.eval_shape(init, seed_value)
    batch0 = host_batch(example_batch, 0)
    extra0 = make_extras(example_batch)
    if mode_b:
        acc_shardings = to_named(accumulator_shardings)
        acc_shapes = jax.eval_shape(init_accumulator, state_shapes)
        metric_shapes = apply_metrics(grad, apply, state_shapes, acc_shapes, batch0)
    else:
        metric_shapes = step_metrics(step, state_shapes, batch0, extra0)
    reference_series = checked_reference_series(metric_shapes, reference_series)
    metric_shardings = jax.tree.map(lambda _: replicated, metric_shapes)
    # keep_unused: an init may ignore the seed (meshrun.torch's weights come from the module).
    init_jit = jax.jit(init, in_shardings=replicated, out_shardings=state_shardings,
                       keep_unused=True)

    os.makedirs(out_dir, exist_ok=True)
    _write_program(out_dir, "init.mlirbc", init_jit, (seed_value,), platforms, [_SEED_ENTRY],
                   False)
    state_entries = entries(state_shapes, state_shardings, mesh, roles, "state")
    batch_entries = entries(batch0, batch_shardings, mesh, roles, "batch")
    extra_entries = [e for (k, (shardings, _)), value in zip(extras.items(), extra0)
                     for e in entries(value, shardings, mesh, roles, k)]
    metric_entries = entries(metric_shapes, metric_shardings, mesh, roles, "metrics")
    n_state = len(state_entries)
    programs = {"init": {"file": "init.mlirbc", "format": "mlir", "inputs": [_SEED_ENTRY],
                         "outputs": state_entries}}
    if mode_b:
        # keep_unused: grad may read only part of the state; it still takes all of it.
        grad_jit = jax.jit(grad, in_shardings=(state_shardings, acc_shardings, batch_shardings),
                           out_shardings=acc_shardings, donate_argnums=(1,), keep_unused=True)
        apply_jit = jax.jit(apply, in_shardings=(state_shardings, acc_shardings),
                            out_shardings=(state_shardings, acc_shardings, metric_shardings),
                            donate_argnums=(0, 1))
        acc_entries = entries(acc_shapes, acc_shardings, mesh, roles, "grad_acc")
        n_acc = len(acc_entries)
        grad_inputs = state_entries + acc_entries + batch_entries
        _write_program(out_dir, "grad.mlirbc", grad_jit, (state_shapes, acc_shapes, batch0),
                       platforms, grad_inputs, True)
        _write_program(out_dir, "apply.mlirbc", apply_jit, (state_shapes, acc_shapes), platforms,
                       state_entries + acc_entries, True)
        programs["grad"] = _program("grad.mlirbc", grad_inputs, acc_entries,
                                    range(n_state, n_state + n_acc))
        programs["apply"] = _program("apply.mlirbc", state_entries + acc_entries,
                                     state_entries + acc_entries + metric_entries,
                                     range(n_state + n_acc))
    else:
        step_inputs = state_entries + batch_entries + extra_entries
        step_jit = jax.jit(step, in_shardings=(state_shardings, batch_shardings) + extra_shardings,
                           out_shardings=(state_shardings, metric_shardings), donate_argnums=(0,),
                           keep_unused=keep_unused)
        _write_program(out_dir, "step.mlirbc", step_jit, (state_shapes, batch0) + extra0,
                       platforms, step_inputs, True, tuple(extras))
        programs["step"] = _program("step.mlirbc", step_inputs, state_entries + metric_entries,
                                    range(n_state))

    job = {"name": name, "model_family": model_family,
           "mesh": _job_mesh(mesh, roles, ids, host_replicas), "programs": programs}
    if mode_b:
        job["grad_accumulation"] = int(grad_accumulation)
    job["seed"] = int(seed)
    if vocab_size:
        job["vocab_size"] = int(vocab_size)
    if data_file:
        job["data"] = _write_data(out_dir, data_file, batches, grad_accumulation, example_batch,
                                  batch_shardings, batch_entries, mesh, roles)
    job["telemetry"] = _telemetry(metric_entries, combine, default_combine, captions,
                                  series_order)
    reference = None
    if reference_steps:
        run = dict(init=init_jit, seed=seed_value, batches=batches, host_batch=host_batch,
                   batch_shardings=batch_shardings, series=reference_series,
                   steps=reference_steps)
        if mode_b:
            values = _reference_b(grad_jit, apply_jit, init_accumulator, acc_shardings,
                                  grad_accumulation, host_replicas, **run)
        else:
            values = _reference_a(step_jit, make_extras, extra_shardings, **run)
        reference = _write_reference(out_dir, values, seed, reference_steps,
                                     grad_accumulation if mode_b else None)
        job["reference"] = "reference.json"
    if compile_options_jax:
        job["compile_options_jax"] = compile_options_jax
    if sparse_attention:
        job["sparse_attention"] = dict(sparse_attention)
    path = os.path.join(out_dir, "job.json")
    _write_json(path, job)
    fit = None
    if target is not None:
        from meshrun.tpu import check_fit  # imports JAX's TPU topology support only when asked
        fit = check_fit(out_dir, target)
    return {"job": path, "reference_loss": reference["loss"] if reference else [],
            "reference": reference, "target": fit}


def _compile_mode_b(step, grad, apply, init_accumulator, accumulator_shardings,
                    grad_accumulation, extra_inputs, host_replicas):
    """Whether the arguments ask for compile mode B (grad + apply) rather than A (step);
    ValueError naming the argument when they mix the two or lack one."""
    mode_b = grad is not None or apply is not None
    if mode_b == (step is not None):
        raise ValueError("pass either step= (compile mode A) or grad= and apply= (mode B)")
    if mode_b and (grad is None or apply is None or init_accumulator is None
                   or accumulator_shardings is None):
        raise ValueError("compile mode B needs grad=, apply=, init_accumulator= and "
                         "accumulator_shardings=")
    if grad_accumulation < 1:
        raise ValueError(f"grad_accumulation must be >= 1, got {grad_accumulation}")
    if extra_inputs and mode_b:
        raise ValueError("extra_inputs= is for compile mode A (step=)")
    if host_replicas < 1 or (host_replicas > 1 and not mode_b):
        raise ValueError(f"host_replicas={host_replicas}: more than one host needs compile mode "
                         "B (grad= and apply=), which averages gradients between hosts")
    return mode_b


def _mesh_device_ids(mesh):
    """The mesh's device ids, which must be 0..n-1 in order (the job's device assignment)."""
    ids = [int(d.id) for d in np.asarray(mesh.devices).flat]
    if ids != list(range(len(ids))):
        raise ValueError(f"mesh devices must be ids 0..{len(ids) - 1} in order, got {ids}")
    return ids


def _job_mesh(mesh, roles, ids, host_replicas):
    """job.json's mesh: axes by role, shape, device ids, host replicas, the user's axis names."""
    job_mesh = {"axes": [roles[a] for a in mesh.axis_names],
                "shape": [int(mesh.shape[a]) for a in mesh.axis_names], "device_ids": ids}
    if host_replicas > 1:
        job_mesh["host_replicas"] = int(host_replicas)
    if list(mesh.axis_names) != job_mesh["axes"]:
        job_mesh["user_axes"] = list(mesh.axis_names)
    return job_mesh


def _write_data(out_dir, data_file, batches, grad_accumulation, example_batch, batch_shardings,
                batch_entries, mesh, roles):
    """Writes the batches as an array file; returns job.json's data: the file, whole steps and
    the global arrays with each host's shard shapes."""
    import jax
    import jax.numpy as jnp
    if len(batches) % grad_accumulation:
        raise ValueError(f"{len(batches)} micro-batches are not whole steps of "
                         f"grad_accumulation={grad_accumulation}")
    write_arrays(os.path.join(out_dir, data_file), batches)
    # Global arrays; each host's devices hold the shards of its own rows.
    arrays = entries(jax.tree.map(jnp.asarray, example_batch), batch_shardings, mesh, roles,
                     "batch")
    for entry, per_host in zip(arrays, batch_entries):
        entry["shard_shape"] = per_host["shard_shape"]
    return {"file": data_file, "steps": len(batches) // grad_accumulation, "arrays": arrays}


def _write_reference(out_dir, values, seed, steps, grad_accumulation):
    """Writes reference.json (JAX's own run: backend, seed, steps, each series per step) and
    returns its contents."""
    import jax
    reference = {"backend": f"jax {jax.__version__} {jax.default_backend()}",
                 "seed": int(seed), "steps": steps}
    if grad_accumulation is not None:
        reference["grad_accumulation"] = int(grad_accumulation)
    reference.update(values)
    _write_json(os.path.join(out_dir, "reference.json"), reference)
    return reference


def _write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


def _record(values, metrics, series):
    for name in series:
        values[name].append(float(np.float32(metrics[name])))


def _reference_a(step_jit, make_extras, extra_shardings, *, init, seed, batches, host_batch,
                 batch_shardings, series, steps):
    """JAX runs the exported step itself, batches cycled; {series: [value per step]}."""
    import jax
    state, values = init(seed), {name: [] for name in series}
    for i in range(steps):
        batch = batches[i % len(batches)]
        extras = tuple(jax.device_put(x, s) for x, s in zip(make_extras(batch), extra_shardings))
        state, metrics = step_jit(state, jax.device_put(host_batch(batch, 0), batch_shardings),
                                  *extras)
        _record(values, metrics, series)
    return values


def _reference_b(grad_jit, apply_jit, init_accumulator, acc_shardings, grad_accumulation,
                 hosts, *, init, seed, batches, host_batch, batch_shardings, series, steps):
    """Mode B as the cluster runs it: each host accumulates its rows of every micro-batch, then
    the hosts' accumulators are averaged (in host order) before apply."""
    import jax
    import jax.numpy as jnp
    state, values = init(seed), {name: [] for name in series}
    for i in range(steps):
        accs = [jax.device_put(init_accumulator(state), acc_shardings) for _ in range(hosts)]
        for m in range(grad_accumulation):
            micro = batches[(i * grad_accumulation + m) % len(batches)]
            for h in range(hosts):
                accs[h] = grad_jit(state, accs[h],
                                   jax.device_put(host_batch(micro, h), batch_shardings))
        acc = accs[0] if hosts == 1 else jax.tree.map(
            lambda *a: functools.reduce(jnp.add, a) / hosts, *accs)
        state, _, metrics = apply_jit(state, acc)
        _record(values, metrics, series)
    return values
