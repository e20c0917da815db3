#!/usr/bin/env python3
"""Exports examples/torch_gpt/: a small GPT written in plain PyTorch, trained with
torch.optim.AdamW, through meshrun.torch (python/meshrun/torch.py, docs/torch.md).

  torch_gpt/dp2_tp2x2/init.mlirbc   init(seed) -> state: the module's own weights (torch's init
                                    after torch.manual_seed(0)) and AdamW's zero state
  torch_gpt/dp2_tp2x2/grad.mlirbc   grad(state, acc, batch) -> acc (compile mode B)
  torch_gpt/dp2_tp2x2/apply.mlirbc  apply(state, acc) -> (state, acc, metrics): AdamW's step()
  torch_gpt/dp2_tp2x2/job.json      one host's (data=2, model=2) mesh, host_replicas 2: two
                                    hosts of 4 devices each take half of every global batch
  torch_gpt/dp2_tp2x2/reference.json  JAX's own run of those programs on data.bin, 8 steps
  torch_gpt/data.bin                8 global batches (8 x 65 bytes of a fixed English text)

The model: byte tokens (vocabulary 256), learned positions, 2 pre-norm blocks (RMSNorm, causal
multi-head attention through F.scaled_dot_product_attention, GELU MLP), a final RMSNorm and a
head tied to the embedding; d=64, 4 heads, context 64, ~120 K parameters. Sharding by name:
attention's qkv and the MLP's up projection split their output features over "model", their
output projections their input features (Megatron); the rest is replicated.

Train it on real text (the fortunes token shards scripts/setup.sh writes) with
  meshrun submit examples/torch_gpt/dp2_tp2x2/job.json --data='.data/fortunes/*.tok' --steps=300
on two 4-device workers (tests/torch_test.sh does, and checks the losses against eager PyTorch).

  .venv-torch/bin/python examples/export_torch_gpt.py           # rewrite examples/torch_gpt
  .venv-torch/bin/python examples/export_torch_gpt.py --check   # regenerate in a temp dir, compare
Exit code 77 (with a message) when torch or torchax is not installed (scripts/install_torch.sh).
"""
import os
import sys
import time

# Fixed before JAX loads: 4 host devices (one host's mesh), CPU only.
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    import jax
    import torchax  # noqa: F401  (meshrun.torch lowers through it)
except ImportError as e:  # pragma: no cover
    print(f"skipped: torch/torchax is not installed ({e}); run scripts/install_torch.sh")
    sys.exit(77)
import meshrun.torch
import regenerate  # examples/regenerate.py: --check and --out

ROOT = os.path.dirname(os.path.abspath(__file__))
NAME, MESH = "torch_gpt", "dp2_tp2x2"
VOCAB, D, HEADS, LAYERS, FF, SEQ, BATCH = 256, 64, 4, 2, 256, 64, 8
LR, WEIGHT_DECAY = 3e-3, 0.1
STEPS = 8


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = torch.nn.RMSNorm(D, eps=1e-6)
        self.qkv = torch.nn.Linear(D, 3 * D, bias=False)
        self.proj = torch.nn.Linear(D, D, bias=False)
        self.norm2 = torch.nn.RMSNorm(D, eps=1e-6)
        self.up = torch.nn.Linear(D, FF, bias=False)
        self.down = torch.nn.Linear(FF, D, bias=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, HEADS, d // HEADS).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, d))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Gpt(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, D)
        self.pos = torch.nn.Parameter(torch.randn(SEQ, D) * 0.02)
        self.blocks = torch.nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = torch.nn.RMSNorm(D, eps=1e-6)
        self.head = torch.nn.Linear(D, VOCAB, bias=False)
        self.head.weight = self.embed.weight   # tied: one parameter, "embed.weight"
        torch.nn.init.normal_(self.embed.weight, std=0.02)

    def forward(self, tokens):
        x = self.embed(tokens) + self.pos[: tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def loss_fn(model, batch):
    """Next-byte cross entropy: tokens [B, SEQ + 1] -> predict tokens[:, 1:]."""
    tokens = batch["tokens"].long()
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))


SHARDINGS = {r"blocks\.\d+\.(qkv|up)\.weight": ("model", None),
             r"blocks\.\d+\.(proj|down)\.weight": (None, "model"),
             r".*": None}


def make_model():
    torch.manual_seed(0)
    model = Gpt()
    return model, torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)


def text_batches(steps):
    """Windows of a fixed English text, one byte per token (data.bin; real runs use --data)."""
    words = ("the quick brown fox jumps over a lazy dog while seven wizards quietly box "
             "jugs of liquid and a jovial sphinx of black quartz judges my vow").split()
    rng = np.random.RandomState(7)
    text = " ".join(words[i] for i in rng.randint(0, len(words), 6000)).encode()
    data = np.frombuffer(text, np.uint8)
    return [{"tokens": np.stack([data[s: s + SEQ + 1] for s in
                                 rng.randint(0, len(data) - SEQ - 1, BATCH)]).astype(np.int32)}
            for _ in range(steps)]


def export_all(out_root, quiet=False):
    model, optimizer = make_model()
    batches = text_batches(STEPS)
    mesh = jax.make_mesh((2, 2), ("data", "model"),
                         axis_types=(jax.sharding.AxisType.Auto,) * 2)
    start = time.time()
    out = meshrun.torch.export(
        os.path.join(out_root, NAME, MESH), model, loss_fn, optimizer=optimizer, mesh=mesh,
        batch=batches[0], batches=batches, shardings=SHARDINGS, host_replicas=2,
        data_file="../data.bin", name=NAME, reference_steps=STEPS, initial_weights="program")
    if not quiet:
        n = sum(p.numel() for p in model.parameters())
        print(f"{NAME}/{MESH}: {n} parameters, exported in {time.time() - start:.1f}s, "
              f"loss {out['reference_loss'][0]:.4f} -> {out['reference_loss'][-1]:.4f}")
    return out


def main():
    return regenerate.main(__doc__, export_all, (NAME,), ROOT, rtol=1e-5)


if __name__ == "__main__":
    sys.exit(main())
