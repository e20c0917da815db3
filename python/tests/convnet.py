"""A small convolutional classifier with bf16 parameters on a (rows, cols) mesh: the SDK
tests' model, deliberately unlike examples/ (no tokens, custom mesh axis names)."""
import numpy as np

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

IMAGE, CLASSES, CHANNELS, BATCH = 8, 4, 8, 8
LR = 0.02


def init(seed):
    k1, k2 = jax.random.split(jax.random.key(seed))
    params = {
        "conv": (jax.random.normal(k1, (3, 3, 1, CHANNELS)) * 0.3).astype(jnp.bfloat16),
        "dense": (jax.random.normal(k2, (CHANNELS * (IMAGE // 2) ** 2, CLASSES)) * 0.05
                  ).astype(jnp.bfloat16),
        "bias": jnp.zeros((CLASSES,), jnp.float32),
    }
    return {"params": params, "count": jnp.zeros((), jnp.int32)}


def loss_fn(params, batch):
    x = batch["images"].astype(jnp.bfloat16)
    h = jax.lax.conv_general_dilated(x, params["conv"], (1, 1), "SAME",
                                     dimension_numbers=("NHWC", "HWIO", "NHWC"))
    h = jax.nn.relu(h)
    h = jax.lax.reduce_window(h, -jnp.inf, jax.lax.max, (1, 2, 2, 1), (1, 2, 2, 1), "VALID")
    logits = (h.reshape(h.shape[0], -1) @ params["dense"]).astype(jnp.float32) + params["bias"]
    logp = jax.nn.log_softmax(logits)
    loss = -jnp.mean(jnp.take_along_axis(logp, batch["labels"][:, None], axis=1))
    accuracy = jnp.mean((jnp.argmax(logits, -1) == batch["labels"]).astype(jnp.float32))
    return loss, accuracy


def step(state, batch):
    (loss, accuracy), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], batch)
    params = jax.tree.map(lambda p, g: (p.astype(jnp.float32) - LR * g.astype(jnp.float32)
                                        ).astype(p.dtype), state["params"], grads)
    grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g.astype(jnp.float32)))
                             for g in jax.tree.leaves(grads)))
    return ({"params": params, "count": state["count"] + 1},
            {"loss": loss, "accuracy": accuracy, "grad_norm": grad_norm})


STATE_SPECS = {"params": {"conv": P(None, None, None, "cols"), "dense": P("cols", None),
                          "bias": P()}, "count": P()}
BATCH_SPECS = {"images": P("rows"), "labels": P("rows")}


def batches(n, seed=1):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        labels = rng.integers(0, CLASSES, size=(BATCH,)).astype(np.int32)
        images = rng.normal(size=(BATCH, IMAGE, IMAGE, 1)).astype(np.float32)
        images[np.arange(BATCH), labels, labels, 0] += 3.0  # learnable signal
        out.append({"images": images, "labels": labels})
    return out


def mesh(names=("rows", "cols")):
    return jax.make_mesh((2, 2), names, devices=jax.devices()[:4])


# Compile mode B: gradients of GRAD_ACCUMULATION micro-batches summed by grad, applied once.
GRAD_ACCUMULATION = 2
ACC_SPECS = {"grads": STATE_SPECS["params"], "loss": P()}


def init_accumulator(state):
    return {"grads": jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), state["params"]),
            "loss": jnp.zeros((), jnp.float32)}


def grad(state, acc, batch):
    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(state["params"], batch)
    return {"grads": jax.tree.map(lambda a, g: a + g.astype(jnp.float32), acc["grads"], grads),
            "loss": acc["loss"] + loss}


def apply(state, acc):
    grads = jax.tree.map(lambda g: g / GRAD_ACCUMULATION, acc["grads"])
    params = jax.tree.map(lambda p, g: (p.astype(jnp.float32) - LR * g).astype(p.dtype),
                          state["params"], grads)
    grad_norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree.leaves(grads)))
    return ({"params": params, "count": state["count"] + 1}, jax.tree.map(jnp.zeros_like, acc),
            {"loss": acc["loss"] / GRAD_ACCUMULATION, "grad_norm": grad_norm})
