"""The parts of meshrun.torch that build the traced programs: the module's arrays by name, the
loss and the optimizer's update called through torchax (the maths stay torch's), sharding
rules, and the checks that refuse what cannot be compiled (docs/torch.md lists each error).

State pytree (job.json names each leaf state.<path>, a checkpoint stores it as <path>/):
  {"params": {<torch name split at dots>: array},   the trainable parameters
   "buffers": {...},                                buffers and frozen parameters (if any)
   "opt": {<optimizer state key>: {<param name>: array}}}   e.g. exp_avg, exp_avg_sq, step"""
import re

import numpy as np

from meshrun.errors import TorchExportError

SUPPORTED_OPTIMIZERS = ("SGD", "Adam", "AdamW")


# ---------------------------------------------------------------- names and arrays

def nest(flat):
    """{"a.b.c": x} -> {"a": {"b": {"c": x}}}: torch's dotted names as a pytree."""
    out = {}
    for name, value in flat.items():
        node = out
        *parents, last = name.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[last] = value
    return out


def flatten(tree, prefix=""):
    """The inverse of nest: {"a.b.c": x}."""
    out = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def to_numpy(name, tensor):
    """A torch tensor as numpy (bf16 through ml_dtypes); s64 becomes s32 (JAX runs 32-bit);
    TorchExportError for f64 and complex, which meshrun does not run."""
    import torch
    t = tensor.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if t.dtype in (torch.float64, torch.complex64, torch.complex128):
        raise TorchExportError(f"{name} is {t.dtype}: meshrun runs 32-bit and 16-bit types; "
                               "convert the model with model.float() (or .to(torch.bfloat16))")
    array = t.numpy()
    return array.astype(np.int32) if array.dtype == np.int64 else array


def to_torch(array):
    """A numpy array (bf16 through ml_dtypes) as a torch tensor."""
    import torch
    array = np.array(array, order="C")   # (ascontiguousarray would make a scalar 1-d)
    if array.dtype.name == "bfloat16":
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


def model_tensors(model):
    """(trainable parameters, buffers and frozen parameters), each {name: tensor}: tied
    parameters once, under the first name torch gives them."""
    params, buffers = {}, {}
    for name, p in model.named_parameters():
        (params if p.requires_grad else buffers)[name] = p
    buffers.update(dict(model.named_buffers()))
    if not params:
        raise TorchExportError("the model has no trainable parameters (requires_grad=True)")
    return params, buffers


def check_module(model):
    """TorchExportError for modules whose training-mode behaviour a compiled step cannot
    reproduce: random dropout (the compiled program would draw the same mask every step) and
    batch norm's running statistics (a buffer the forward pass changes)."""
    import torch
    for name, m in model.named_modules():
        p = getattr(m, "p", 0.0) if isinstance(m, torch.nn.modules.dropout._DropoutNd) else (
            getattr(m, "dropout", 0.0) if isinstance(m, torch.nn.MultiheadAttention) else 0.0)
        if m.training and isinstance(p, float) and p > 0:
            raise TorchExportError(
                f"module \"{name or type(m).__name__}\" drops out (p={p}) in training mode: a "
                "compiled step would draw the same mask every step; set its p to 0 (or call "
                ".eval() on it) before exporting")
        if (isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.training
                and m.track_running_stats):
            raise TorchExportError(
                f"module \"{name}\" is batch norm in training mode: its running statistics are "
                "buffers the forward pass changes, which the step does not carry over; use "
                "LayerNorm/RMSNorm/GroupNorm, or track_running_stats=False")


# ---------------------------------------------------------------- sharding rules

def param_specs(names_shapes, rules, mesh_axes, what="parameter"):
    """{name: PartitionSpec} from `rules` {regex: spec} (the first pattern that fully matches
    the name wins; spec: a tuple of mesh axis names or None per leading dimension, a
    PartitionSpec, or None/() for replicated). rules=None replicates everything.
    TorchExportError names a name no rule matches, an axis the mesh lacks, a spec longer
    than the array's rank."""
    from jax.sharding import PartitionSpec as P
    out = {}
    for name, shape in names_shapes.items():
        if rules is None:
            out[name] = P()
            continue
        for pattern, spec in rules.items():
            if re.fullmatch(pattern, name):
                break
        else:
            raise TorchExportError(
                f"{what} \"{name}\" (shape {list(shape)}) matches no pattern of shardings "
                f"{list(rules)}; add a rule for it, or r\".*\": None last to replicate the rest")
        spec = tuple(spec) if spec is not None else ()
        for axis in spec:
            for a in (axis if isinstance(axis, tuple) else (axis,)):
                if a is not None and a not in mesh_axes:
                    raise TorchExportError(
                        f"shardings[{pattern!r}] splits {what} \"{name}\" over mesh axis "
                        f"\"{a}\", which the mesh (axes {tuple(mesh_axes)}) does not have")
        if len(spec) > len(shape):
            raise TorchExportError(
                f"shardings[{pattern!r}] gives {len(spec)} dimensions for {what} \"{name}\" "
                f"of shape {list(shape)}")
        out[name] = P(*spec)
    return out


# ---------------------------------------------------------------- the optimizer

def optimizer_groups(optimizer, params):
    """[(param names, hyperparameters)] of each param group; TorchExportError for an
    unsupported optimizer, a tensor that is no trainable parameter of the model, or a trainable
    parameter in no group."""
    import torch
    cls = type(optimizer)
    if cls.__name__ not in SUPPORTED_OPTIMIZERS or cls.__module__.split(".")[:2] != ["torch",
                                                                                     "optim"]:
        raise TorchExportError(
            f"optimizer {cls.__module__}.{cls.__name__} is not supported: use one of "
            f"torch.optim.{{{', '.join(SUPPORTED_OPTIMIZERS)}}}")
    by_id = {id(p): n for n, p in params.items()}
    groups, seen = [], set()
    for g, group in enumerate(optimizer.param_groups):
        names = []
        for p in group["params"]:
            if id(p) not in by_id:
                raise TorchExportError(
                    f"optimizer.param_groups[{g}] holds a tensor of shape {list(p.shape)} that "
                    "is not a trainable parameter of the model: build the optimizer over "
                    "model.parameters()")
            names.append(by_id[id(p)])
        hyper = {k: (float(v) if isinstance(v, torch.Tensor) else v)
                 for k, v in group.items() if k != "params"}
        if cls is torch.optim.SGD and hyper.get("dampening", 0) and not optimizer.state:
            raise TorchExportError(
                f"optimizer.param_groups[{g}]: SGD with dampening={hyper['dampening']} starts its "
                "momentum from the first gradient undamped, which a compiled step cannot tell "
                "apart; use dampening=0, or load an optimizer state_dict first")
        groups.append((names, hyper))
        seen.update(names)
    left = [n for n in params if n not in seen]
    if left:
        raise TorchExportError(
            f"trainable parameters {left} are in no param group of the optimizer: add them, "
            "or freeze them with requires_grad_(False)")
    return groups


def zero_state(cls, params, groups):
    """{param name: {state key: zeros}}: the state optimizer class `cls` keeps with these param
    groups, found by one step on zero tensors of the parameters' shapes (torch starts these
    buffers at zero)."""
    import torch
    probes = {n: torch.zeros_like(p.detach(), requires_grad=True) for n, p in params.items()}
    probe = cls([dict(h, params=[probes[n] for n in names]) for names, h in groups])
    for t in probes.values():
        t.grad = torch.zeros_like(t)
    probe.step()
    return {n: {k: torch.zeros_like(v) for k, v in probe.state[probes[n]].items()
                if isinstance(v, torch.Tensor)} for n in params}


def initial_optimizer_state(optimizer, params, groups):
    """{state key: {param name: numpy}}: the optimizer's own state where it has one (a loaded
    state_dict), else its zero state (zero_state)."""
    import torch
    cls = type(optimizer)
    if optimizer.state:
        tensors = {n: optimizer.state.get(p, {}) for n, p in params.items()}
        missing = [n for n, s in tensors.items() if not s]
        if missing and len(missing) != len(params):
            raise TorchExportError(f"optimizer.state holds no state for parameters {missing}")
    else:
        tensors = zero_state(cls, params, groups)
    out = {}
    for name, state in tensors.items():
        for key, value in state.items():
            if not isinstance(value, torch.Tensor):
                raise TorchExportError(f"optimizer state \"{key}\" of \"{name}\" is not a tensor")
            out.setdefault(key, {})[name] = to_numpy(f"optimizer state {key} of {name}", value)
    return out


def torch_update(cls, groups):
    """update(params, grads, state) -> (params, state), all {name: tensor} (state {key: {name:
    tensor}}), for torchax.interop.call_torch: the optimizer class's own step() on the param
    groups' hyperparameters, with capturable=True (the step count stays a tensor) and the
    single-tensor code path (foreach=False)."""
    def update(params, grads, state):
        torch_groups = []
        for names, hyper in groups:
            h = dict(hyper, foreach=False)
            if "capturable" in h:
                h["capturable"] = True
            if "fused" in h:
                h["fused"] = None
            torch_groups.append(dict(h, params=[params[n] for n in names]))
        opt = cls(torch_groups)
        for name, p in params.items():
            p.grad = grads[name]
            opt.state[p] = {key: by_name[name] for key, by_name in state.items()
                            if name in by_name}
        opt.step()
        return params, {key: {n: opt.state[params[n]][key] for n in by_name}
                        for key, by_name in state.items()}
    return update


# ---------------------------------------------------------------- the loss

def torch_loss(model, loss_fn):
    """loss(tensors, batch) -> {"loss": scalar, other metrics}, for call_torch: loss_fn(model,
    batch) with the model's parameters and buffers replaced by `tensors` ({name: tensor})."""
    import torch

    class _Loss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, batch):
            return loss_fn(self.model, batch)

    wrapper = _Loss()

    def loss(tensors, batch):
        out = torch.func.functional_call(
            wrapper, {f"model.{n}": t for n, t in tensors.items()}, (batch,), strict=False)
        return _metrics(out)
    return loss


def _metrics(out):
    import torch
    if isinstance(out, torch.Tensor):
        out = {"loss": out}
    elif isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict):
        out = {"loss": out[0], **out[1]}
    if not isinstance(out, dict) or not isinstance(out.get("loss"), torch.Tensor):
        raise TorchExportError("loss_fn must return the loss (a scalar tensor), (loss, {name: "
                               "scalar tensor}) or a dict holding \"loss\"; it returned "
                               f"{type(out).__name__}")
    for name, value in out.items():
        if not isinstance(value, torch.Tensor) or value.dim() != 0:
            raise TorchExportError(f"loss_fn's metric \"{name}\" is not a scalar tensor")
    return out


def explain_trace_error(error):
    """A TorchExportError saying what in loss_fn cannot be compiled, or None to re-raise."""
    import jax
    text = str(error)
    if isinstance(error, (jax.errors.ConcretizationTypeError,
                          jax.errors.TracerBoolConversionError,
                          jax.errors.TracerIntegerConversionError)):
        return TorchExportError(
            "loss_fn reads a tensor's value in Python (.item(), bool(), int(), if tensor:): "
            "the step is compiled once, without values; use tensor operations (torch.where) "
            f"instead ({type(error).__name__})")
    if "does not require grad" in text or "does not have a grad_fn" in text:
        return TorchExportError(
            "loss_fn calls torch autograd (loss.backward() or torch.autograd.grad): meshrun "
            "takes the gradients with JAX; return the loss instead")
    return None


def refuse_step(*args, **kwargs):
    """Stands in for the user's optimizer.step while loss_fn is traced."""
    raise TorchExportError(
        "loss_fn calls optimizer.step(): meshrun runs the optimizer's update itself after each "
        "step's gradients; return the loss instead (and drop zero_grad/backward/step)")
