"""Data files workers read (docs/data.md).

write_arrays: the array-batch file of a bundle (job.json "data"): for each batch in order, each
array of the batch in the job's input order (the pytree's leaf order), raw little-endian,
row-major, no header or padding. Shapes and dtypes live in job.json's data.arrays."""
import numpy as np

# numpy dtype name -> meshrun dtype name (runtime/types.cc)
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


_SHARD_HEADER = "<8sIIIIQQQ"  # magic, version, vocab, bos, token width (v2; v1: 0), tokens, docs, first doc


def write_token_shards(out_prefix, documents, *, vocab_size, bos=0, dtype="u16",
                       shard_tokens=1 << 24):
    """Writes token shard files (docs/data.md) out_prefix-00000.tok, ...: `documents` is an
    iterable of integer sequences, each written as BOS + its tokens; a shard closes after
    `shard_tokens` tokens on a document boundary. dtype "u16" writes version 1 (vocab_size <=
    65,536), "u32" version 2 with 4-byte tokens (vocab_size <= 2**31). Returns the paths.
    ValueError names a document holding BOS or a token outside the vocabulary."""
    import struct

    if dtype not in ("u16", "u32"):
        raise ValueError(f"dtype \"{dtype}\" is not u16 or u32")
    limit = 65536 if dtype == "u16" else 1 << 31
    if not 0 <= bos < vocab_size <= limit:
        raise ValueError(f"vocab_size {vocab_size} / bos {bos}: need bos < vocab_size <= {limit} "
                         f"for {dtype} tokens" + (" (use dtype=\"u32\")" if dtype == "u16" else ""))
    np_dtype = np.dtype("<u2" if dtype == "u16" else "<u4")
    version, width = (1, 0) if dtype == "u16" else (2, 4)
    paths, pieces, starts, count, first_doc = [], [], [], 0, 0

    def flush():
        nonlocal pieces, starts, count, first_doc
        path = f"{out_prefix}-{len(paths):05d}.tok"
        with open(path, "wb") as f:
            f.write(struct.pack(_SHARD_HEADER, b"MRTOKSHD", version, vocab_size, bos, width,
                                count, len(starts), first_doc))
            for piece in pieces:
                f.write(piece.astype(np_dtype).tobytes())
            f.write(np.asarray(starts, dtype="<u8").tobytes())
        paths.append(path)
        first_doc += len(starts)
        pieces, starts, count = [], [], 0

    for d, doc in enumerate(documents):
        doc = np.asarray(doc, dtype=np.int64)
        if doc.size and (doc.min() < 0 or doc.max() >= vocab_size or (doc == bos).any()):
            raise ValueError(f"document {d} holds the BOS token {bos} or a token outside "
                             f"[0, {vocab_size})")
        starts.append(count)
        pieces.append(np.concatenate([[bos], doc]))
        count += 1 + doc.size
        if count >= shard_tokens:
            flush()
    if starts:
        flush()
    return paths
