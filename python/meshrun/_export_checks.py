"""meshrun.export's checks of the user's functions, made on their shapes (jax.eval_shape) before
anything is lowered or written: what step / grad / apply return, the loss, the reference
series, and the message for an input a program does not read. Each error names the array at
fault (as job.json names it: state.<path>, batch.<path>, ...) and the fix, and mentions only
options the caller passed."""
import numpy as np

from meshrun._lowering import _leaf_name


def _describe(leaf):
    """float32[8, 4], bfloat16[] (JAX's spelling), or the type of what is not an array."""
    if not hasattr(leaf, "shape") or not hasattr(leaf, "dtype"):
        return f"a {type(leaf).__name__}"
    return f"{np.dtype(leaf.dtype).name}{list(leaf.shape)}"


def _quoted(names):
    return ", ".join(f'"{n}"' for n in names)


def _named(tree, prefix):
    """{job.json name: leaf}, in the order the job declares them."""
    import jax
    return {prefix + _leaf_name(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _unpacked(fn, out, parts):
    """`out` as the tuple `parts` names; ValueError saying what `fn` must return."""
    if not isinstance(out, tuple) or len(out) != len(parts):
        got = f"{len(out)} values" if isinstance(out, (tuple, list)) else _describe(out)
        raise ValueError(f"{fn} must return ({', '.join(parts)}); it returns {got}")
    return out


def check_same_arrays(fn, made_by, before, after, prefix):
    """`fn` returns `after` (e.g. the state) where it took `before`, which `made_by` makes; the
    worker feeds it to the next step in place (donated), so each leaf must keep its path, dtype
    and shape. ValueError naming each leaf that differs, both dtypes and shapes, and the fix."""
    import jax
    ins, outs = _named(before, prefix), _named(after, prefix)
    added = [n for n in outs if n not in ins]
    missing = [n for n in ins if n not in outs]
    if added or missing or jax.tree.structure(before) != jax.tree.structure(after):
        what = [f"adds {_quoted(added)}"] * bool(added) + [f"leaves out {_quoted(missing)}"] * \
            bool(missing) or [f"is a {jax.tree.structure(after)}, not the "
                              f"{jax.tree.structure(before)} {made_by} makes"]
        raise ValueError(f"{fn} returns a {prefix} that {' and '.join(what)}: it must return the "
                         f"{prefix} {made_by} makes, leaf for leaf (a new leaf starts in "
                         f"{made_by})")
    changed = [(n, x, outs[n]) for n, x in ins.items()
               if (tuple(x.shape), np.dtype(x.dtype)) != (tuple(outs[n].shape),
                                                          np.dtype(outs[n].dtype))]
    if changed:
        raise ValueError(
            f"{fn} returns " + "; ".join(f'"{n}" as {_describe(y)}, where {made_by} makes '
                                         f"{_describe(x)}" for n, x, y in changed) +
            f". The next step takes the {prefix} {fn} returns in place, so each leaf must keep "
            f"the dtype and shape {made_by} gives it: " +
            "; ".join(_same_array_fix(fn, made_by, *c) for c in changed))


def _same_array_fix(fn, made_by, name, before, after):
    cast = (f" (.astype(jnp.{np.dtype(before.dtype).name}))"
            if np.dtype(before.dtype) != np.dtype(after.dtype) else "")
    return (f'return "{name}" as {_describe(before)} from {fn}{cast}, or make it '
            f"{_describe(after)} in {made_by}")


def _check_loss(fn, metrics):
    if not isinstance(metrics, dict) or "loss" not in metrics:
        got = f"a dict of {sorted(metrics)}" if isinstance(metrics, dict) else _describe(metrics)
        raise ValueError(f"{fn} must return metrics as a dict holding a scalar \"loss\"; it "
                         f"returns {got}")
    loss = metrics["loss"]
    if getattr(loss, "shape", None) != ():
        raise ValueError(f"{fn} returns metrics[\"loss\"] as {_describe(loss)}; the loss must be "
                         f"a scalar (shape []): reduce it in {fn}, e.g. with jnp.mean over the "
                         "batch")


def step_metrics(step, state, batch, extras):
    """Compile mode A: the shapes of step(state, batch, *extras)'s metrics, after checking that
    it returns (state, metrics) with the init's state and a scalar loss."""
    import jax
    new_state, metrics = _unpacked("step", jax.eval_shape(step, state, batch, *extras),
                                   ("state", "metrics"))
    check_same_arrays("step", "init", state, new_state, "state")
    _check_loss("step", metrics)
    return metrics


def apply_metrics(grad, apply, state, acc, batch):
    """Compile mode B: the shapes of apply's metrics, after checking that grad returns the
    accumulator init_accumulator makes and apply (state, accumulator, metrics) as they came in,
    with a scalar loss."""
    import jax
    check_same_arrays("grad", "init_accumulator", acc, jax.eval_shape(grad, state, acc, batch),
                      "grad_acc")
    new_state, new_acc, metrics = _unpacked("apply", jax.eval_shape(apply, state, acc),
                                            ("state", "accumulator", "metrics"))
    check_same_arrays("apply", "init", state, new_state, "state")
    check_same_arrays("apply", "init_accumulator", acc, new_acc, "grad_acc")
    _check_loss("apply", metrics)
    return metrics


def checked_reference_series(metrics, reference_series):
    """"loss" (checked with the metrics) first, then the other metrics named, each a scalar;
    ValueError naming one that is not."""
    series = ("loss",) + tuple(n for n in reference_series if n != "loss")
    for name in series[1:]:
        if name not in metrics:
            raise ValueError(f"reference_series names \"{name}\", which is not one of the "
                             f"metrics {sorted(metrics)}")
        if getattr(metrics[name], "shape", None) != ():
            raise ValueError(f"reference_series names \"{name}\", which is not a scalar of the "
                             f"metrics ({_describe(metrics[name])}): leave it out of "
                             "reference_series")
    return series


_FIXES = {"batch": "remove {it} from the batch (example_batch and batch_shardings)",
          "state": "remove {it} from the state (init and state_shardings)",
          "grad_acc": "remove {it} from the accumulator (init_accumulator and "
                      "accumulator_shardings)"}


def dropped_message(file, names, dropped, extras):
    """The error for program `file` (step.mlirbc, ...), whose lowering left out the inputs at
    indices `dropped` of `names` (None: unknown) because the function does not read them.
    `extras`: the extra_inputs names the caller passed (mode A)."""
    fn = file.split(".")[0]
    if not dropped:
        return (f"{file}: {fn} does not read some of its inputs ({len(names)} declared), so JAX "
                "left them out of the program, but the worker feeds every input the job "
                f"declares: read each input in {fn}, or remove the ones it does not need")
    unread = [names[i] for i in dropped]
    it = "it" if len(unread) == 1 else "them"
    fixes = []
    for group in dict.fromkeys(n.split(".")[0] for n in unread):
        fixes.append(_FIXES.get(group, f"remove {{it}} from extra_inputs[\"{group}\"]").format(
            it=it))
    message = (f"{file}: {fn} does not read {_quoted(unread)}, so JAX left {it} out of the "
               f"program, but the worker feeds every input the job declares: use {it} in "
               f"{'the step' if fn == 'step' else fn}, or {'; or '.join(fixes)}")
    if extras:  # a batch array read only through an extra input's make(batch)
        message += (f". A step that takes {it} only for extra_inputs to read exports with "
                    "keep_unused=True")
    return message
