"""meshrun.export: a JAX training step (compile mode A) or grad + apply (mode B) as a meshrun
bundle directory.

    meshrun.export.export(out_dir, init=init, step=step, mesh=mesh,
                          state_shardings=..., batch_shardings=..., example_batch=batch,
                          batches=[...], axis_roles={"rows": "data", "cols": "model"})

writes out_dir/{job.json, init.mlirbc, step.mlirbc, data.bin}: init(seed: u32[]) -> state and
step(state, batch) -> (state, metrics) as StableHLO (state donated), the job file with each
array's name, dtype, global shape and sharding, one telemetry series per metrics leaf, and the
batches (meshrun.data.write_arrays format). `metrics` must hold a scalar "loss".

Mesh axes and roles: meshrun runs a mesh of (data, expert, model). An axis named data, model
or expert takes that role (the convention); any other name must be mapped by `axis_roles`, and
an unmapped name raises ValueError naming it. The mesh's axes must be in the order
data, expert, model and its devices in id order (jax.make_mesh's default)."""
import json
import os

import numpy as np

from meshrun.data import DTYPE_NAMES, write_arrays

ROLES = ("data", "expert", "model")  # meshrun's mesh order (coordinator/mesh_planner.cc)
COMBINES = ("mean", "max", "min", "sum", "last")


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


def _portable_artifact(jitted, args, platforms):
    """The jitted function lowered for `args` as a serialized StableHLO portable artifact
    (jax.export's public API: versioned, with its shardings and donated inputs)."""
    import jax
    exported = jax.export.export(jitted, platforms=platforms)(*args)
    return exported.mlir_module_serialized, exported.mlir_module()


def _leaf_name(path):
    return "".join(f".{k.key}" if hasattr(k, "key") else
                   f".{k.name}" if hasattr(k, "name") else f".{k.idx}" for k in path)


def _entries(tree, shardings, mesh, roles, prefix):
    import jax
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    flat_shardings = jax.tree.leaves(shardings)
    if len(flat) != len(flat_shardings):
        raise ValueError(f"{prefix}: {len(flat)} arrays but {len(flat_shardings)} shardings")
    out = []
    for (path, leaf), sharding in zip(flat, flat_shardings):
        name = prefix + _leaf_name(path)
        shape = [int(d) for d in leaf.shape]
        spec = tuple(sharding.spec) + (None,) * (len(shape) - len(sharding.spec))
        axes, shard_shape = [], list(shape)
        for i, axis in enumerate(spec):
            if isinstance(axis, tuple):
                if len(axis) > 1:
                    raise ValueError(f"{name}: dimension {i} splits over several axes {axis}; "
                                     "meshrun splits a dimension over one axis")
                axis = axis[0] if axis else None
            size = mesh.shape[axis] if axis is not None else 1
            if shape[i] % size:
                raise ValueError(f"{name}: dimension {i} ({shape[i]}) does not split {size} ways")
            shard_shape[i] //= size
            # A size-1 axis other than data is not in meshrun's mesh: not split.
            role = roles[axis] if axis is not None else None
            axes.append(role if role and (size > 1 or role == "data") else None)
        dtype = np.dtype(leaf.dtype).name
        if dtype not in DTYPE_NAMES:
            raise ValueError(f"{name}: dtype {dtype} is not supported")
        out.append({"name": name, "dtype": DTYPE_NAMES[dtype], "shape": shape,
                    "sharding": axes, "shard_shape": shard_shape})
    return out


def _write_program(out_dir, file, jitted, args, platforms):
    code, _ = _portable_artifact(jitted, args, platforms)
    with open(os.path.join(out_dir, file), "wb") as f:
        f.write(code)


def _program(file, inputs, outputs, donated):
    return {"file": file, "format": "mlir", "inputs": inputs, "outputs": outputs,
            "donated_inputs": list(donated)}


def export(out_dir, *, init, step=None, mesh, state_shardings, batch_shardings, example_batch,
           batches=None, data_file="data.bin", seed=0, axis_roles=None, combine=None,
           default_combine="mean", name="model", model_family="dense", platforms=None,
           reference_steps=0, grad=None, apply=None, init_accumulator=None,
           accumulator_shardings=None, grad_accumulation=1, captions=None):
    """Writes the bundle; returns {"job": path to job.json, "reference_loss": [...]}.

    Compile mode A: `step(state, batch) -> (state, metrics)`.
    Compile mode B (instead of `step`): `grad(state, acc, batch) -> acc` runs on each of
    `grad_accumulation` micro-batches, then `apply(state, acc) -> (state, acc, metrics)` once
    (it must return the accumulator zeroed for the next step); `init_accumulator(state) -> acc`
    gives the accumulator's structure (its zeros start each run) and `accumulator_shardings` its
    shardings. `batches` are then micro-batches, grad_accumulation per step.

    state_shardings / batch_shardings: pytrees (matching the state and the batch) of
    PartitionSpec or NamedSharding on `mesh`. batches: the batches written to data.bin (default
    [example_batch]); data_file=None writes none (the job then trains on --data).
    combine: {metric leaf name: "mean"|"max"|"min"|"sum"|"last"} over hosts, others
    `default_combine`. captions: {metric leaf name: "rows × columns" caption} for 2-D series
    (the dashboard's heatmap). reference_steps > 0 also runs JAX itself on the batches and
    writes reference.json {"loss": [...]} (test data; meshrun does not need it)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    mode_b = grad is not None or apply is not None
    if mode_b == (step is not None):
        raise ValueError("pass either step= (compile mode A) or grad= and apply= (mode B)")
    if mode_b and (grad is None or apply is None or init_accumulator is None
                   or accumulator_shardings is None):
        raise ValueError("compile mode B needs grad=, apply=, init_accumulator= and "
                         "accumulator_shardings=")
    if grad_accumulation < 1:
        raise ValueError(f"grad_accumulation must be >= 1, got {grad_accumulation}")
    roles = resolve_axis_roles(mesh.axis_names, axis_roles)
    ids = [int(d.id) for d in np.asarray(mesh.devices).flat]
    if ids != list(range(len(ids))):
        raise ValueError(f"mesh devices must be ids 0..{len(ids) - 1} in order, got {ids}")
    to_named = lambda tree: jax.tree.map(
        lambda s: s if isinstance(s, NamedSharding) else NamedSharding(mesh, s), tree,
        is_leaf=lambda x: isinstance(x, (PartitionSpec, NamedSharding)))
    state_shardings = to_named(state_shardings)
    batch_shardings = to_named(batch_shardings)
    replicated = NamedSharding(mesh, PartitionSpec())

    seed_value = jnp.asarray(seed, jnp.uint32)
    state_shapes = jax.eval_shape(init, seed_value)
    batch0 = jax.tree.map(jnp.asarray, example_batch)
    if mode_b:
        acc_shardings = to_named(accumulator_shardings)
        acc_shapes = jax.eval_shape(init_accumulator, state_shapes)
        _, _, metric_shapes = jax.eval_shape(apply, state_shapes, acc_shapes)
    else:
        _, metric_shapes = jax.eval_shape(step, state_shapes, batch0)
    if not isinstance(metric_shapes, dict) or "loss" not in metric_shapes:
        raise ValueError(f"{'apply' if mode_b else 'step'} must return metrics as a dict holding "
                         "\"loss\"")
    metric_shardings = jax.tree.map(lambda _: replicated, metric_shapes)
    init_jit = jax.jit(init, in_shardings=replicated, out_shardings=state_shardings)

    os.makedirs(out_dir, exist_ok=True)
    _write_program(out_dir, "init.mlirbc", init_jit, (seed_value,), platforms)
    state_entries = _entries(state_shapes, state_shardings, mesh, roles, "state")
    batch_entries = _entries(batch0, batch_shardings, mesh, roles, "batch")
    metric_entries = _entries(metric_shapes, metric_shardings, mesh, roles, "metrics")
    n_state = len(state_entries)
    programs = {"init": {"file": "init.mlirbc", "format": "mlir",
                         "inputs": [{"name": "seed", "dtype": "u32", "shape": [], "sharding": [],
                                     "shard_shape": []}],
                         "outputs": state_entries}}
    if mode_b:
        # keep_unused: grad may read only part of the state; it still takes all of it.
        grad_jit = jax.jit(grad, in_shardings=(state_shardings, acc_shardings, batch_shardings),
                           out_shardings=acc_shardings, donate_argnums=(1,), keep_unused=True)
        apply_jit = jax.jit(apply, in_shardings=(state_shardings, acc_shardings),
                            out_shardings=(state_shardings, acc_shardings, metric_shardings),
                            donate_argnums=(0, 1))
        _write_program(out_dir, "grad.mlirbc", grad_jit, (state_shapes, acc_shapes, batch0),
                       platforms)
        _write_program(out_dir, "apply.mlirbc", apply_jit, (state_shapes, acc_shapes), platforms)
        acc_entries = _entries(acc_shapes, acc_shardings, mesh, roles, "grad_acc")
        n_acc = len(acc_entries)
        programs["grad"] = _program("grad.mlirbc", state_entries + acc_entries + batch_entries,
                                    acc_entries, range(n_state, n_state + n_acc))
        programs["apply"] = _program("apply.mlirbc", state_entries + acc_entries,
                                     state_entries + acc_entries + metric_entries,
                                     range(n_state + n_acc))
    else:
        step_jit = jax.jit(step, in_shardings=(state_shardings, batch_shardings),
                           out_shardings=(state_shardings, metric_shardings), donate_argnums=(0,))
        _write_program(out_dir, "step.mlirbc", step_jit, (state_shapes, batch0), platforms)
        programs["step"] = _program("step.mlirbc", state_entries + batch_entries,
                                    state_entries + metric_entries, range(n_state))

    combine = dict(combine or {})
    captions = dict(captions or {})
    telemetry = []
    for entry in metric_entries:
        series = entry["name"][len("metrics."):]
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
    batches = [example_batch] if batches is None else list(batches)
    job = {
        "name": name,
        "model_family": model_family,
        "mesh": {"axes": [roles[a] for a in mesh.axis_names],
                 "shape": [int(mesh.shape[a]) for a in mesh.axis_names],
                 "device_ids": ids, "user_axes": list(mesh.axis_names)},
        "programs": programs,
        "seed": int(seed),
        "telemetry": telemetry,
    }
    if mode_b:
        job["grad_accumulation"] = int(grad_accumulation)
    if data_file:
        if len(batches) % grad_accumulation:
            raise ValueError(f"{len(batches)} micro-batches are not whole steps of "
                             f"grad_accumulation={grad_accumulation}")
        write_arrays(os.path.join(out_dir, data_file), batches)
        job["data"] = {"file": data_file, "steps": len(batches) // grad_accumulation,
                       "arrays": batch_entries}
    losses = []
    if reference_steps:
        state = init_jit(seed_value)
        put = lambda i: jax.device_put(jax.tree.map(jnp.asarray, batches[i % len(batches)]),
                                       batch_shardings)
        for i in range(reference_steps):
            if mode_b:
                acc = jax.device_put(init_accumulator(state), acc_shardings)
                for m in range(grad_accumulation):
                    acc = grad_jit(state, acc, put(i * grad_accumulation + m))
                state, _, metrics = apply_jit(state, acc)
            else:
                state, metrics = step_jit(state, put(i))
            losses.append(float(np.float32(metrics["loss"])))
        job["reference"] = "reference.json"
        with open(os.path.join(out_dir, "reference.json"), "w") as f:
            json.dump({"backend": f"jax {jax.__version__}", "seed": int(seed),
                       "steps": reference_steps, "loss": losses}, f, indent=1)
            f.write("\n")
    path = os.path.join(out_dir, "job.json")
    with open(path, "w") as f:
        json.dump(job, f, indent=1)
        f.write("\n")
    return {"job": path, "reference_loss": losses}
