"""meshrun.torch: a PyTorch nn.Module, a loss written in torch and a torch optimizer as a
meshrun bundle (the same files meshrun.export writes), and a meshrun checkpoint back into the
module (docs/torch.md).

    model = MyModel()                                        # your init or load_state_dict
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mesh = jax.make_mesh((2, 2), ("data", "model"))
    out = meshrun.torch.export("bundle", model, lambda m, b: F.cross_entropy(m(b["x"]), b["y"]),
                               optimizer=opt, mesh=mesh, batch=batches[0], batches=batches,
                               shardings={r".*fc1\\.weight": ("model", None), r".*": None})
    client.submit("bundle", steps=50, resume_from=out["resume_from"])   # None: weights inline
    ...
    meshrun.torch.load_state_dict(model, "/ckpt/run1", optimizer=opt)  # newest committed step

The forward pass and the loss run as torch code through torchax (torch ops lowered to JAX);
gradients come from JAX (jax.value_and_grad of that loss); the update is the optimizer class's
own step() run through torchax on the parameter groups' hyperparameters. Needs torch and
torchax (scripts/install_torch.sh puts them in .venv-torch)."""
import os

import numpy as np

from meshrun import _torch_step as ts
from meshrun.checkpoints import resolve_checkpoint
from meshrun.errors import TorchExportError

INLINE_WEIGHTS_BYTES = 4 << 20   # "auto": larger initial states go in as a checkpoint

__all__ = ["TorchExportError", "export", "load_state_dict"]


def export(out_dir, model, loss_fn, *, optimizer, mesh, batch, batches=None, shardings=None,
           batch_shardings=None, host_replicas=1, grad_accumulation=1, axis_roles=None,
           initial_weights="auto", name="torch_model", combine=None, data_file="data.bin",
           reference_steps=0, platforms=None):
    """Writes the bundle to out_dir; returns meshrun.export's result plus "resume_from": the
    initial checkpoint to submit with (None when the weights are in the init program),
    "state_bytes", and "params" (the trained parameters' names).

    model: an nn.Module on the CPU, with the weights to start from (its own init or a loaded
    state_dict; nothing is re-initialised). Its parameters with requires_grad train; frozen
    ones and buffers are carried unchanged.
    loss_fn(model, batch) -> the loss (a scalar tensor), (loss, {name: scalar tensor}) or a
    dict holding "loss"; batch is a dict of tensors. Each metric becomes a telemetry series.
    optimizer: a torch.optim.SGD / Adam / AdamW over model.parameters(); its param groups give
    the hyperparameters (constant: no LR scheduler), its state (a loaded state_dict) the moments
    to start from, else zeros as torch starts them.
    mesh: a jax.sharding.Mesh (meshrun.export's axis rules; axis_roles maps other names).
    shardings: {regex: spec}, the first pattern that fully matches a parameter's (or buffer's)
    torch name gives its PartitionSpec: a tuple of mesh axis names (or None) per dimension,
    None for replicated (torch_xla's mark_sharding(tensor, mesh, spec) by name). None:
    everything replicated. The optimizer state of a parameter is split as it is.
    batch: a dict of arrays (numpy or torch; s64 is written as s32); batches: the batches of
    data.bin (default [batch]). batch_shardings: {name: spec}; default: every array split over
    the data axis on its first dimension.
    host_replicas > 1 (hosts that each take their rows of every global batch, averaging
    gradients) or grad_accumulation > 1 export compile mode B (grad + apply), else mode A.
    initial_weights: "program" (constants in init.mlirbc), "checkpoint" (an Orbax checkpoint
    at out_dir/initial_weights/0; init then fills the state with NaN, so a job submitted
    without resume_from shows a NaN loss at once) or "auto" (a checkpoint past 4 MiB).
    TorchExportError names what is not supported (docs/torch.md)."""
    import jax
    import jax.numpy as jnp
    import torch
    from jax.sharding import PartitionSpec as P
    from torchax.interop import call_torch

    import meshrun.export as mexport

    if initial_weights not in ("auto", "program", "checkpoint"):
        raise TorchExportError(f"initial_weights=\"{initial_weights}\": use \"auto\", "
                               "\"program\" or \"checkpoint\"")
    if not isinstance(model, torch.nn.Module):
        raise TorchExportError(f"model is a {type(model).__name__}, not a torch.nn.Module")
    ts.check_module(model)
    params, buffers = ts.model_tensors(model)
    groups = ts.optimizer_groups(optimizer, params)
    state0 = {"params": {n: ts.to_numpy(f"parameter {n}", p) for n, p in params.items()}}
    if buffers:
        state0["buffers"] = {n: ts.to_numpy(f"buffer {n}", b) for n, b in buffers.items()}
    opt0 = ts.initial_optimizer_state(optimizer, params, groups)
    state0["opt"] = opt0

    roles = mexport.resolve_axis_roles(mesh.axis_names, axis_roles)
    specs = ts.param_specs({n: a.shape for n, a in {**state0["params"],
                                                    **state0.get("buffers", {})}.items()},
                           shardings, mesh.axis_names)
    state_specs = {"params": ts.nest({n: specs[n] for n in params})}
    if buffers:
        state_specs["buffers"] = ts.nest({n: specs[n] for n in buffers})
    state_specs["opt"] = {key: ts.nest({
        n: specs[n] if a.shape == state0["params"][n].shape else P() for n, a in by.items()})
        for key, by in opt0.items()}
    nested0 = {k: ts.nest(v) if k != "opt" else {key: ts.nest(by) for key, by in v.items()}
               for k, v in state0.items()}

    batch = _numpy_batch(batch)
    batches = [batch] if batches is None else [_numpy_batch(b) for b in batches]
    if batch_shardings is None:
        data_axis = next((a for a, r in roles.items() if r == "data"), None)
        batch_shardings = {k: P(data_axis) if data_axis and v.ndim else P()
                           for k, v in batch.items()}
    else:
        batch_shardings = {k: v if isinstance(v, P) else P(*(v or ()))
                           for k, v in batch_shardings.items()}

    loss_torch = ts.torch_loss(model, loss_fn)
    update = ts.torch_update(type(optimizer), groups)

    def loss_jax(trained, carried, batch):
        metrics = call_torch(loss_torch, {**ts.flatten(trained), **ts.flatten(carried)}, batch)
        loss = metrics.pop("loss")
        return loss, {k: v.astype(jnp.float32) for k, v in metrics.items()}

    def grads_of(state, batch):
        (loss, aux), grads = jax.value_and_grad(loss_jax, has_aux=True)(
            state["params"], state.get("buffers", {}), batch)
        return {"loss": loss.astype(jnp.float32), **aux}, grads

    def apply_update(state, grads):
        flat_opt = {k: ts.flatten(v) for k, v in state["opt"].items()}
        new_params, new_opt = call_torch(update, ts.flatten(state["params"]),
                                         ts.flatten(grads), flat_opt)
        out = dict(state, params=ts.nest(new_params))
        out["opt"] = {k: ts.nest(v) for k, v in new_opt.items()}
        return out

    state_bytes = sum(a.nbytes for a in jax.tree.leaves(nested0))
    as_checkpoint = initial_weights == "checkpoint" or (
        initial_weights == "auto" and state_bytes > INLINE_WEIGHTS_BYTES)

    def init(seed):
        del seed  # the weights are the module's
        if as_checkpoint:
            return jax.tree.map(lambda a: jnp.full(a.shape, np.nan, a.dtype) if jnp.issubdtype(
                a.dtype, jnp.floating) else jnp.zeros(a.shape, a.dtype), nested0)
        return jax.tree.map(jnp.asarray, nested0)

    common = dict(init=init, mesh=mesh, state_shardings=state_specs,
                  batch_shardings=batch_shardings, example_batch=batch, batches=batches,
                  axis_roles=axis_roles, combine=combine, name=name, data_file=data_file,
                  reference_steps=reference_steps, platforms=platforms)
    mode_b = host_replicas > 1 or grad_accumulation > 1
    saved = optimizer.__dict__.get("step")
    optimizer.step = ts.refuse_step   # loss_fn must not step the real optimizer while traced
    try:
        if mode_b:
            out = _export_mode_b(out_dir, common, grads_of, apply_update, state_specs,
                                 host_replicas, grad_accumulation)
        else:
            def step(state, batch):
                metrics, grads = grads_of(state, batch)
                return apply_update(state, grads), metrics
            # keep_unused: a batch array or buffer the loss does not read stays an input.
            out = mexport.export(out_dir, step=step, keep_unused=True, **common)
    except TorchExportError:
        raise
    except Exception as e:  # what torch code inside the trace cannot do, explained
        explained = ts.explain_trace_error(e)
        if explained is None:
            raise
        raise explained from e
    finally:
        if saved is None:
            del optimizer.step
        else:
            optimizer.step = saved

    resume_from = None
    if as_checkpoint:
        resume_from = _write_initial_checkpoint(os.path.join(out_dir, "initial_weights"),
                                                nested0)
    return dict(out, resume_from=resume_from, state_bytes=int(state_bytes),
                params=list(params))


def _export_mode_b(out_dir, common, grads_of, apply_update, state_specs, host_replicas,
                   grad_accumulation):
    """grad(state, acc, batch) -> acc sums each micro-batch's f32 gradients and metrics;
    apply(state, acc) averages them, runs the optimizer and returns the accumulator zeroed."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P

    import meshrun.export as mexport
    micro = int(grad_accumulation)

    metric_names = _metric_names(common, grads_of)

    def init_accumulator(state):
        return {"grads": jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32),
                                      state["params"]),
                "metrics": {k: jnp.zeros((), jnp.float32) for k in metric_names}}

    def grad(state, acc, batch):
        metrics, grads = grads_of(state, batch)
        return {"grads": jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc["grads"],
                                      grads),
                "metrics": {k: acc["metrics"][k] + v for k, v in metrics.items()}}

    def apply(state, acc):
        grads = jax.tree.map(lambda g, p: (g / micro).astype(p.dtype), acc["grads"],
                             state["params"])
        metrics = {k: v / micro for k, v in acc["metrics"].items()}
        return apply_update(state, grads), jax.tree.map(jnp.zeros_like, acc), metrics

    acc_specs = {"grads": state_specs["params"], "metrics": {k: P() for k in metric_names}}
    return mexport.export(out_dir, grad=grad, apply=apply, init_accumulator=init_accumulator,
                          accumulator_shardings=acc_specs, grad_accumulation=micro,
                          host_replicas=host_replicas, model_family="dense", **common)


def _metric_names(common, grads_of):
    import jax
    import jax.numpy as jnp
    state = jax.eval_shape(common["init"], jnp.uint32(0))
    batch = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                         common["example_batch"])
    metrics, _ = jax.eval_shape(grads_of, state, batch)
    return list(metrics)


def _numpy_batch(batch):
    if not isinstance(batch, dict):
        raise TorchExportError(f"a batch must be a dict of arrays, got {type(batch).__name__}")
    out = {}
    for k, v in batch.items():
        out[k] = ts.to_numpy(f"batch \"{k}\"", v) if hasattr(v, "detach") else np.asarray(v)
        if out[k].dtype == np.int64:
            out[k] = out[k].astype(np.int32)
    return out


def _write_initial_checkpoint(directory, state):
    """The initial state as an Orbax checkpoint at step 0 (uncompressed layout meshrun reads);
    returns the step directory."""
    import orbax.checkpoint as ocp
    path = os.path.abspath(os.path.join(directory, "0"))
    ocp.Checkpointer(ocp.PyTreeCheckpointHandler(use_ocdbt=False)).save(path, state, force=True)
    return path


# ---------------------------------------------------------------- weights back

def _read_leaf(step_dir, leaf, shape):
    """One array of a checkpoint as a torch tensor of `shape` where the sizes agree (Orbax may
    store a scalar as [1])."""
    import tensorstore
    store = tensorstore.open({"driver": "zarr", "kvstore": {
        "driver": "file", "path": os.path.join(step_dir, leaf)}}).result()
    value = np.asarray(store.read().result())
    if value.shape != tuple(shape) and value.size == int(np.prod(shape)):
        value = value.reshape(tuple(shape))
    return ts.to_torch(value)


def load_state_dict(model, checkpoint, optimizer=None):
    """Fills `model` (and `optimizer`, built over model.parameters() with the class that
    trained) from a meshrun checkpoint: a step directory, or a checkpoint directory (its newest
    committed step). Returns the step. TorchExportError names a tensor the checkpoint lacks or
    whose shape differs; BundleError a partial checkpoint."""
    import torch
    step_dir = resolve_checkpoint(checkpoint)
    leaves = {d for d in os.listdir(step_dir) if os.path.isdir(os.path.join(step_dir, d))}
    canonical = {}   # tensor id -> the name it was exported under (tied tensors: the first)
    for name, t in list(model.named_parameters(remove_duplicate=False)) + list(
            model.named_buffers(remove_duplicate=False)):
        canonical.setdefault(id(t), name)
    trained = dict(model.named_parameters())
    state = {}
    for key, t in model.state_dict(keep_vars=True).items():
        name = canonical.get(id(t), key)
        tree = "params" if name in trained and trained[name].requires_grad else "buffers"
        leaf = f"{tree}.{name}"
        if leaf not in leaves:
            raise TorchExportError(f"{step_dir} holds no array for \"{key}\" (looked for "
                                   f"{leaf}/): is it a checkpoint of this model's export?")
        value = _read_leaf(step_dir, leaf, t.shape)
        if tuple(value.shape) != tuple(t.shape):
            raise TorchExportError(f"\"{key}\" is {list(value.shape)} in {step_dir}, "
                                   f"{list(t.shape)} in the model")
        state[key] = value.to(t.dtype) if value.dtype != t.dtype else value
    model.load_state_dict(state)
    if optimizer is not None:
        _load_optimizer(optimizer, model, step_dir, leaves)
    base = os.path.basename(step_dir)
    return int(base) if base.isdigit() else None


def _load_optimizer(optimizer, model, step_dir, leaves):
    """The optimizer's state from the checkpoint's opt.<key>.<param> arrays; TorchExportError
    when they are not the state this optimizer (class and settings) keeps."""
    keys = sorted({leaf.split(".")[1] for leaf in leaves if leaf.startswith("opt.")})
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    groups = ts.optimizer_groups(optimizer, params)
    zeros = ts.zero_state(type(optimizer), params, groups)
    expected = sorted({k for state in zeros.values() for k in state})
    if keys != expected:
        raise TorchExportError(
            f"{step_dir} holds optimizer state {keys}, a torch.optim.{type(optimizer).__name__} "
            f"with these settings keeps {expected}: pass the optimizer (class and settings) "
            "that trained, or optimizer=None for the weights alone")
    state, index = {}, 0
    for names, _ in groups:
        for name in names:
            state[index] = {k: _read_leaf(step_dir, f"opt.{k}.{name}", zero.shape)
                            for k, zero in zeros[name].items()}
            index += 1
    optimizer.load_state_dict({"state": state,
                               "param_groups": optimizer.state_dict()["param_groups"]})
