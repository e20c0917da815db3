"""meshrun.export's building blocks: a jitted function as a StableHLO portable artifact, and the
job file's array entries (name, dtype, global shape, sharding by role, per-device shape)."""
import re

import numpy as np

from meshrun.data import DTYPE_NAMES, leaf_name as _leaf_name


def portable_artifact(jitted, args, platforms=None):
    """The jitted function lowered for `args`, without source locations, serialized as a
    versioned StableHLO portable artifact; returns (bytes, text of the module).

    The one private JAX API in meshrun.export, isolated here because jax.export (the public
    route) embeds source locations (the exporting file's path and lines) in the artifact, so
    the same model exported from two checkouts differs byte for byte, and has no option to
    leave them out. Lowering and printing are public (trace().lower(), as_text(debug_info=
    False)); only serializing the location-free text as a portable artifact is private."""
    from jax._src.lib import xla_client
    from jax._src.lib.mlir.dialects import hlo

    lowered = jitted.trace(*args).lower(
        lowering_platforms=tuple(platforms) if platforms else None)
    text = lowered.as_text(debug_info=False)
    # A StableHLO version at least 12 weeks old: runtimes up to that much older than the JAX
    # that exported read it (jax.export targets 4 weeks).
    target = hlo.get_version_from_compatibility_requirement(
        hlo.StablehloCompatibilityRequirement.WEEK_12)
    # As jax.export serializes (Shardy shardings kept), minus the locations.
    return xla_client._xla.mlir.serialize_portable_artifact(text, target, True), text


def _main_signature(text):
    return next(line for line in text.splitlines() if "func.func public @main" in line)


def check_program(what, text, n_inputs, donated, dropped_message=None):
    """The worker feeds every input the job declares and reuses donated buffers: a program that
    dropped an input or lost its donation would fail or copy at run time, so refuse it here.
    dropped_message(): the RuntimeError's message for a program that dropped inputs (default:
    the two counts)."""
    main = _main_signature(text)
    if main.count("%arg") != n_inputs:
        raise RuntimeError(dropped_message() if dropped_message else
                           f"{what}: the lowered program takes {main.count('%arg')} inputs, the "
                           f"job declares {n_inputs}: the function does not read some input")
    if donated and "tf.aliasing_output" not in text:
        raise RuntimeError(f"{what}: the donated inputs alias no output (give the state the same "
                           "shapes, dtypes and shardings in and out)")


_LOC = r'loc\((?:"((?:[^"\\]|\\.)*)"|#(loc\d+))'  # loc("name") or loc(#alias)


def dropped_inputs(jitted, args, platforms=None):
    """Indices, among the flattened `args`, of the inputs JAX left out of the lowered program
    because the function never reads them (jit's keep_unused=False); None where JAX's debug
    information does not say. For an error message only: it lowers again, keeping the argument
    names (`loc("batch['mask']")`) that the exported text leaves out, and matches them against
    the traced function's argument names (its jaxpr's debug_info)."""
    traced = jitted.trace(*args)
    names = getattr(getattr(traced.jaxpr.jaxpr, "debug_info", None), "arg_names", None)
    text = traced.lower(lowering_platforms=tuple(platforms) if platforms else None).as_text(
        debug_info=True)
    aliases = dict(re.findall(r'^#(loc\d+) = loc\("((?:[^"\\]|\\.)*)"', text, re.M))
    main = _main_signature(text)
    kept = {name or aliases.get(alias) for name, alias in re.findall(r"%arg\d+: [^%]*?" + _LOC,
                                                                    main)}
    if not names or len(kept) != main.count("%arg") or not kept <= set(names):
        return None
    return [i for i, name in enumerate(names) if name not in kept]


def entries(tree, shardings, mesh, roles, prefix):
    """One job-file entry per leaf of `tree` (arrays or shape structs), named prefix.<path>;
    `shardings` is a matching pytree of NamedSharding. ValueError names the leaf at fault."""
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
