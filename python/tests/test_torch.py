"""meshrun.torch without a cluster: what it refuses (each error docs/torch.md lists), and an
initial-weights checkpoint read back with load_state_dict. Needs torch and torchax (run in
.venv-torch by tests/torch_test.sh; skipped elsewhere)."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchax")
import jax  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import meshrun.torch  # noqa: E402
import torch_models as tm  # noqa: E402
from meshrun.errors import TorchExportError  # noqa: E402


def mesh():
    devices = np.array(jax.devices()[:4]).reshape(2, 2)
    return jax.sharding.Mesh(devices, ("data", "model"))


def export(tmp_path, model=None, loss_fn=tm.mlp_loss, optimizer=None, **kwargs):
    model = model if model is not None else tm.mlp()
    optimizer = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-3)
    kwargs.setdefault("shardings", tm.MLP_SHARDINGS)
    return meshrun.torch.export(str(tmp_path), model, loss_fn, optimizer=optimizer, mesh=mesh(),
                                batch=tm.mlp_batches(1)[0], **kwargs)


def refused(tmp_path, match, **kwargs):
    with pytest.raises(TorchExportError, match=match):
        export(tmp_path, **kwargs)


def test_torch_autograd_in_the_loss_is_refused(tmp_path):
    def backward(model, batch):
        loss, _ = tm.mlp_loss(model, batch)
        loss.backward()
        return loss
    refused(tmp_path, r"calls torch autograd .*meshrun takes the gradients with JAX",
            loss_fn=backward)


def test_optimizer_step_in_the_loss_is_refused(tmp_path):
    model = tm.mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def steps(m, batch):
        loss, _ = tm.mlp_loss(m, batch)
        opt.step()
        return loss
    refused(tmp_path, r"calls optimizer.step\(\)", model=model, optimizer=opt, loss_fn=steps)
    assert "step" not in opt.__dict__   # the optimizer's own step() is back


def test_python_branch_on_a_value_is_refused(tmp_path):
    def branches(model, batch):
        loss, _ = tm.mlp_loss(model, batch)
        return loss * 2 if loss.item() > 1 else loss
    refused(tmp_path, r"reads a tensor's value in Python", loss_fn=branches)


def test_training_dropout_and_batch_norm_are_refused(tmp_path):
    drop = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Dropout(0.1))
    refused(tmp_path, r"module \"1\" drops out \(p=0.1\)", model=drop, shardings=None,
            loss_fn=lambda m, b: m(b["x"]).square().mean())
    norm = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.BatchNorm1d(8))
    refused(tmp_path, r"module \"1\" is batch norm in training mode", model=norm,
            shardings=None, loss_fn=lambda m, b: m(b["x"]).square().mean())
    drop.eval()   # eval mode: no dropout, exported
    export(tmp_path, model=drop, shardings=None, loss_fn=lambda m, b: m(b["x"]).square().mean())


def test_optimizers_outside_sgd_adam_adamw_and_foreign_tensors_are_refused(tmp_path):
    model = tm.mlp()
    refused(tmp_path, r"torch.optim.rmsprop.RMSprop is not supported: use one of "
            r"torch.optim.\{SGD, Adam, AdamW\}", model=model,
            optimizer=torch.optim.RMSprop(model.parameters()))
    other = torch.nn.Linear(3, 3)
    refused(tmp_path, r"param_groups\[0\] holds a tensor of shape \[3, 3\] that is not a "
            r"trainable parameter", model=model,
            optimizer=torch.optim.Adam(list(model.parameters()) + [other.weight]))
    refused(tmp_path, r"trainable parameters \['4.weight', '4.bias'\] are in no param group",
            model=model, optimizer=torch.optim.Adam(list(model.parameters())[:4]))
    refused(tmp_path, r"SGD with dampening=0.5", model=model,
            optimizer=torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, dampening=0.5))


def test_sharding_rules_name_the_parameter_and_axis(tmp_path):
    refused(tmp_path, r"parameter \"2.weight\" \(shape \[64, 64\]\) matches no pattern of "
            r"shardings \['0\\\\..*'\]; add a rule", shardings={r"0\..*": None})
    refused(tmp_path, r"shardings\['0\\\\.weight'\] splits parameter \"0.weight\" over mesh "
            r"axis \"expert\", which the mesh \(axes \('data', 'model'\)\) does not have",
            shardings={r"0\.weight": ("expert", None), r".*": None})
    refused(tmp_path, r"gives 3 dimensions for parameter \"0.bias\" of shape \[64\]",
            shardings={r"0\.bias": (None, None, "model"), r".*": None})


def test_float64_is_refused(tmp_path):
    refused(tmp_path, r"parameter 0.weight is torch.float64: .* model.float\(\)",
            model=tm.mlp(torch.float64), shardings=None)


def test_initial_weights_checkpoint_loads_back(tmp_path):
    """initial_weights="checkpoint": init holds no weights (NaN), the state is an Orbax
    checkpoint at step 0, and load_state_dict gives back the module and optimizer exactly."""
    model = tm.mlp()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.zeros(1, tm.FEATURES)).sum().backward()
    opt.step()   # a state to carry: step 1, non-zero moments
    out = export(tmp_path / "bundle", model=model, optimizer=opt, initial_weights="checkpoint")
    assert out["resume_from"] == str(tmp_path / "bundle" / "initial_weights" / "0")
    assert os.path.getsize(tmp_path / "bundle" / "init.mlirbc") < 10_000   # no weights inside
    other = tm.mlp()
    torch.nn.init.zeros_(other[0].weight)
    other_opt = torch.optim.Adam(other.parameters(), lr=1e-3)
    assert meshrun.torch.load_state_dict(other, out["resume_from"], optimizer=other_opt) == 0
    for (name, a), b in zip(model.state_dict().items(), other.state_dict().values()):
        assert torch.equal(a, b), name
    want, got = opt.state_dict()["state"], other_opt.state_dict()["state"]
    assert want.keys() == got.keys()
    for i in want:
        for key in want[i]:
            assert torch.equal(want[i][key], got[i][key]), (i, key)
    wrong = torch.nn.Linear(16, 64)
    with pytest.raises(TorchExportError, match=r"holds no array for \"weight\" \(looked for "
                       r"params.weight/\)"):
        meshrun.torch.load_state_dict(wrong, out["resume_from"])


def test_tied_weights_train_once_and_load_under_both_names(tmp_path):
    model, opt = tm.gpt.make_model()
    out = meshrun.torch.export(
        str(tmp_path), model, tm.gpt.loss_fn, optimizer=opt, mesh=mesh(),
        batch=tm.gpt.text_batches(1)[0], shardings=tm.gpt.SHARDINGS,
        initial_weights="checkpoint")
    assert "head.weight" not in out["params"] and "embed.weight" in out["params"]
    fresh, _ = tm.gpt.make_model()
    torch.nn.init.zeros_(fresh.embed.weight)
    meshrun.torch.load_state_dict(fresh, out["resume_from"])
    assert fresh.head.weight is fresh.embed.weight
    assert torch.equal(fresh.head.weight, model.embed.weight)
    assert F.mse_loss(fresh.pos, model.pos) == 0


def two_groups(m):
    return [{"params": list(m[0].parameters()), "lr": 1e-3},
            {"params": list(m[2].parameters()) + list(m[4].parameters()), "weight_decay": 0.01}]


@pytest.mark.parametrize("make", [
    lambda m: torch.optim.Adam(m.parameters(), lr=1e-3, amsgrad=True),
    lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9, nesterov=True),
    lambda m: torch.optim.AdamW(two_groups(m), lr=2e-3)], ids=["amsgrad", "nesterov", "groups"])
def test_optimizer_settings_train_like_eager_torch_in_jax(tmp_path, make):
    """More settings, 20 steps of the exported programs run by JAX (export's reference_steps;
    the cluster runs these programs with the same losses, test_torch_cluster.py)."""
    model = tm.mlp()
    optimizer = make(model)
    batches = tm.mlp_batches(20)
    want, _, _ = tm.eager(model, optimizer, tm.mlp_loss, batches)
    out = export(tmp_path, model=model, optimizer=optimizer, batches=batches, reference_steps=20)
    np.testing.assert_allclose(out["reference_loss"], want, rtol=1e-5)


def test_load_state_dict_refuses_another_optimizer(tmp_path):
    model = tm.mlp()
    out = export(tmp_path, model=model, initial_weights="checkpoint",
                 optimizer=torch.optim.Adam(model.parameters()))
    with pytest.raises(TorchExportError, match=r"holds optimizer state \['exp_avg', "
                       r"'exp_avg_sq', 'step'\], a torch.optim.SGD with these settings keeps "
                       r"\['momentum_buffer'\]: pass the optimizer"):
        meshrun.torch.load_state_dict(model, out["resume_from"], optimizer=torch.optim.SGD(
            model.parameters(), lr=0.1, momentum=0.9))
