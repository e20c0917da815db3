"""What the meshrun.torch tests train: a small MLP (any optimizer), the torch GPT example
(examples/export_torch_gpt.py), eager PyTorch CPU runs of them, and the rows a worker feeds
from token shards (mirroring worker/batch_sources.cc, so eager torch sees the same batches)."""
import copy
import glob
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "examples")
sys.path.insert(0, EXAMPLES)
import export_torch_gpt as gpt  # noqa: E402  (the example's model, loss and shardings)

FEATURES, HIDDEN, CLASSES, ROWS = 16, 64, 8, 32
MLP_SHARDINGS = {r"0\.weight": ("model", None), r"0\.bias": ("model",),
                 r"2\.weight": (None, "model"), r".*": None}
OPTIMIZERS = {
    "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=1e-4),
    "adam": lambda p: torch.optim.Adam(p, lr=1e-3),
    "adamw": lambda p: torch.optim.AdamW(p, lr=3e-3, weight_decay=0.1),
}


def mlp(dtype=torch.float32):
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.ReLU(),
                               torch.nn.Linear(HIDDEN, CLASSES)).to(dtype)


def mlp_loss(model, batch):
    logits = model(batch["x"].to(model[0].weight.dtype)).float()
    accuracy = (logits.argmax(-1) == batch["label"]).float().mean()
    return F.cross_entropy(logits, batch["label"].long()), {"accuracy": accuracy}


def mlp_batches(steps):
    """Gaussian inputs labelled by a fixed linear teacher."""
    rng = np.random.RandomState(1234)
    teacher = rng.randn(FEATURES, CLASSES).astype(np.float32)
    out = []
    for _ in range(steps):
        x = rng.randn(ROWS, FEATURES).astype(np.float32)
        out.append({"x": x, "label": np.argmax(x @ teacher, axis=1).astype(np.int32)})
    return out


def eager(model, optimizer, loss_fn, batches, capturable=False):
    """Trains deep copies of model and optimizer on the CPU as a torch user would; returns
    (losses, model, optimizer). capturable=True runs Adam/AdamW's capturable code path (what
    meshrun compiles: the step count a tensor, bias corrections in float32) on the CPU, which
    torch otherwise allows on accelerators only."""
    import torch.optim.adam as adam
    model, opt = copy.deepcopy((model, optimizer))   # the copy's optimizer holds the copy's
    supported = adam._get_capturable_supported_devices
    if capturable:
        for group in opt.param_groups:
            group["capturable"] = True
        adam._get_capturable_supported_devices = lambda *a, **k: supported(*a, **k) + ["cpu"]
    losses = []
    try:
        for batch in batches:
            out = loss_fn(model, {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()})
            loss = out[0] if isinstance(out, tuple) else out
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    finally:
        adam._get_capturable_supported_devices = supported
    return losses, model, opt


# ---------------------------------------------------------------- token shards

def _split_mix(x):
    m = (1 << 64) - 1
    x = (x + 0x9E3779B97F4A7C15) & m
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & m
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & m
    return x ^ (x >> 31)


def _row_hash(seed, step, row):
    return _split_mix(_split_mix(_split_mix(seed) ^ step) ^ row)


def token_batches(pattern, steps, rows, length, seed=0):
    """The global batches a job's workers build from the token shards matching `pattern`:
    row r of step s (from 1) starts at the BOS of document RowHash(seed, s, r) % windows."""
    tokens, starts, offset = [], [], 0
    for path in sorted(glob.glob(pattern)):
        data = open(path, "rb").read()
        _, version, _, _, width, n, docs, _ = struct.unpack_from("<8sIIIIQQQ", data)
        width = 2 if version == 1 else width
        tokens.append(np.frombuffer(data, f"<u{width}", n, 48).astype(np.int32))
        starts.append(np.frombuffer(data, "<u8", docs, 48 + width * n).astype(np.int64) + offset)
        offset += n
    tokens, starts = np.concatenate(tokens), np.concatenate(starts)
    windows = int(np.searchsorted(starts, len(tokens) - length, side="right"))
    out = []
    for step in range(1, steps + 1):
        picks = [starts[_row_hash(seed, step, r) % windows] for r in range(rows)]
        out.append({"tokens": np.stack([tokens[s:s + length] for s in picks])})
    return out
