"""Data files workers read (docs/data.md).

write_arrays: a typed array-batch file (job.json "data", or `--data`): a header naming each
array, its dtype and shape, then for each batch in order each array of the batch in the job's
input order (the pytree's leaf order), raw little-endian, row-major."""
import numpy as np

# numpy dtype name -> meshrun dtype name (runtime/types.cc)
DTYPE_NAMES = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float64": "f64",
               "int8": "s8", "int16": "s16", "int32": "s32", "int64": "s64",
               "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "pred"}


def leaf_name(path):
    """A pytree key path as meshrun names it: ".tokens", ".0", ".layer.w"."""
    return "".join(f".{k.key}" if hasattr(k, "key") else
                   f".{k.name}" if hasattr(k, "name") else f".{k.idx}" for k in path)


def _named_leaves(batch, prefix):
    """[(name, leaf)] in the job's input order: prefix + the leaf's pytree path."""
    try:
        import jax
    except ImportError:  # a flat dict or list of arrays without JAX
        items = batch.items() if isinstance(batch, dict) else enumerate(batch)
        return [(f"{prefix}.{k}", v) for k, v in items]
    return [(prefix + leaf_name(p), v) for p, v in jax.tree_util.tree_flatten_with_path(batch)[0]]


ARRAY_MAGIC = b"MRARRAYS"
ARRAY_VERSION = 1
_ARRAY_PREFIX = "<8sII"  # magic, format version, header bytes (prefix + JSON, a multiple of 64)


def write_arrays(path, batches, *, prefix="batch"):
    """Writes batches (a list of pytrees of arrays with identical structure, shapes and dtypes:
    the job's global batches) to `path` as a typed array file (docs/data.md): a header naming
    each array (prefix + its pytree path, as meshrun.export names the step's batch inputs),
    its dtype and shape, the batch count and the batches' sha256, then the batches. The
    coordinator refuses at submit a file whose arrays are not the ones the program takes.
    Returns the number of batches. ValueError names the batch and array that differs."""
    import hashlib
    import json
    import struct

    batches = list(batches)
    first, layout0 = None, None
    for b, batch in enumerate(batches):
        named = [(n, np.asarray(x)) for n, x in _named_leaves(batch, prefix)]
        layout = [(n, x.shape, x.dtype) for n, x in named]
        if first is None:
            first, layout0 = named, layout
        elif layout != layout0:
            raise ValueError(f"batch {b} has arrays {layout}, batch 0 has {layout0}")
    arrays = []
    for name, x in first or []:
        if x.dtype.name not in DTYPE_NAMES:
            raise ValueError(f"array {name}: dtype {x.dtype} has no meshrun dtype "
                             f"({', '.join(DTYPE_NAMES)})")
        arrays.append({"name": name, "dtype": DTYPE_NAMES[x.dtype.name],
                       "shape": [int(d) for d in x.shape]})

    def header(sha):
        text = json.dumps({"arrays": arrays, "batches": len(batches), "payload_sha256": sha})
        size = -(-(struct.calcsize(_ARRAY_PREFIX) + len(text)) // 64) * 64
        prefix_bytes = struct.pack(_ARRAY_PREFIX, ARRAY_MAGIC, ARRAY_VERSION, size)
        return (prefix_bytes + text.encode()).ljust(size, b" ")

    digest = hashlib.sha256()
    with open(path, "wb") as f:
        f.write(header("0" * 64))  # the same length as the real one, written once it is known
        for batch in batches:
            for _, x in _named_leaves(batch, prefix):
                x = np.asarray(x)
                data = np.ascontiguousarray(x).astype(x.dtype.newbyteorder("<")).tobytes()
                digest.update(data)
                f.write(data)
        f.seek(0)
        f.write(header(digest.hexdigest()))
    return len(batches)


def read_array_header(path):
    """The header of a typed array file as a dict (arrays, batches, payload_sha256), or None
    for a file written before typed files, whose layout nothing can check."""
    import json
    import struct

    with open(path, "rb") as f:
        head = f.read(struct.calcsize(_ARRAY_PREFIX))
        if len(head) < struct.calcsize(_ARRAY_PREFIX) or head[:8] != ARRAY_MAGIC:
            return None
        _, version, size = struct.unpack(_ARRAY_PREFIX, head)
        if version != ARRAY_VERSION:
            raise ValueError(f"{path}: array file format version {version}; this meshrun reads "
                             f"{ARRAY_VERSION}")
        return json.loads(f.read(size - len(head)))


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
