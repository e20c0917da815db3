"""Data files workers read (docs/data.md).

write_arrays: the array-batch file of a bundle (job.json "data"): for each batch in order, each
array of the batch in the job's input order (the pytree's leaf order), raw little-endian,
row-major, no header or padding. Shapes and dtypes live in job.json's data.arrays."""
import numpy as np

# numpy dtype name -> meshrun dtype name (worker/runtime/types.cc)
DTYPE_NAMES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64",
               "int8": "s8", "int16": "s16", "int32": "s32", "int64": "s64",
               "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "pred"}


def _leaves(batch):
    try:
        import jax
        return jax.tree.leaves(batch)
    except ImportError:  # a flat dict or list of arrays without JAX
        return list(batch.values()) if isinstance(batch, dict) else list(batch)


def write_arrays(path, batches):
    """Writes batches (a list of pytrees of arrays with identical structure, shapes and dtypes)
    to `path`; returns the number of batches. ValueError names the batch and array that differs."""
    first = None
    with open(path, "wb") as f:
        for b, batch in enumerate(batches):
            leaves = [np.asarray(x) for x in _leaves(batch)]
            layout = [(x.shape, x.dtype) for x in leaves]
            if first is None:
                first = layout
            elif layout != first:
                raise ValueError(f"batch {b} has arrays {layout}, batch 0 has {first}")
            for x in leaves:
                f.write(np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<")).tobytes())
    return 0 if first is None else len(batches)
