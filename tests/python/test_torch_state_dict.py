"""optex.torch.OptEx.state_dict(): torch.optim's shape, tensors and plain values only
(torch.load(weights_only=True) reads it), a bit-for-bit resume, an option to leave the
history out, and every malformed state refused with nothing changed."""

from __future__ import annotations

import io

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from optex.torch import OptEx  # noqa: E402
from torch_models import TwoHeads, bits, closure_for, flat, make_data  # noqa: E402


def make(model, **kwargs):
    return OptEx([{"params": [*model.body.parameters(), *model.a.parameters()]},
                  {"params": list(model.b.parameters()), "lr": 0.05, "weight_decay": 0.0}],
                 optimizer=kwargs.pop("optimizer", "adamw"), lr=0.02, parallelism=3, history=6, seed=4,
                 **kwargs)


def run(model, opt, data, steps):
    for _ in range(steps):
        opt.step(closure_for(opt, model, data))
    return bits(flat(model.parameters()))


def through_file(state, weights_only=True):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=weights_only)


def leaves(value, path="state_dict"):
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{path}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def trained(steps=4, **kwargs):
    data = make_data()
    model = TwoHeads()
    model.use_b = True
    opt = make(model, **kwargs)
    run(model, opt, data, steps)
    return model, opt, data


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_a_resume_through_weights_only_load_continues_bit_for_bit(optimizer) -> None:
    kwargs = {"optimizer": optimizer}
    if optimizer == "sgd":
        kwargs["momentum"] = 0.9
    model, opt, data = trained(**kwargs)
    state = through_file(opt.state_dict())
    for path, leaf in leaves(state):
        assert isinstance(leaf, (torch.Tensor, int, float, str, bool, type(None))), path
    model2 = TwoHeads()
    model2.use_b = True
    model2.load_state_dict(model.state_dict())
    opt2 = make(model2, **kwargs)
    opt2.load_state_dict(state)
    assert run(model2, opt2, data, 3) == run(model, opt, data, 3)


def test_the_per_parameter_state_is_torch_optims() -> None:
    model, opt, _ = trained()
    theirs_model = TwoHeads()
    theirs_model.use_b = True
    theirs = torch.optim.AdamW(theirs_model.parameters())
    theirs_model(torch.zeros(1, 4)).sum().backward()
    theirs.step()
    state = opt.state_dict()["state"]
    their_state = theirs.state_dict()["state"]
    assert set(state) == set(their_state) == set(range(6))
    for i, p in enumerate(p for g in opt.param_groups for p in g["params"]):
        assert set(state[i]) == set(their_state[i])
        assert state[i]["exp_avg"].shape == p.shape and state[i]["exp_avg"].dtype == torch.float32
        assert int(state[i]["step"]) == opt.engine.state_arrays()["step"]


def test_leaving_the_history_out_keeps_everything_else() -> None:
    model, opt, data = trained()
    full, lean = opt.state_dict(), opt.state_dict(history=False)
    assert "history" in full["optex"]["engine"] and "history" not in lean["optex"]["engine"]
    sizes = [len(through_bytes(s)) for s in (full, lean)]
    assert sizes[1] < sizes[0]
    model2 = TwoHeads()
    model2.use_b = True
    model2.load_state_dict(model.state_dict())
    opt2 = make(model2)
    opt2.load_state_dict(lean)
    a, b = opt.engine.state_arrays(), opt2.engine.state_arrays()
    assert b["history"]["size"] == 0
    for key in ("x", "step", "iteration", "evaluations", "rng", "lengthscale"):
        assert bits_of(a[key]) == bits_of(b[key]), key
    for name in a["slots"]:
        assert bits_of(a["slots"][name]) == bits_of(b["slots"][name])
    # Without its history the resumed run warms up again: not the same run.
    assert run(model2, opt2, data, 2) != run(model, opt, data, 2)
    with pytest.raises(ValueError, match="history: must be a bool"):
        opt.state_dict(history="no")


def through_bytes(state) -> bytes:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def bits_of(value):
    return value.tobytes() if hasattr(value, "tobytes") else repr(value)


def test_a_frozen_parameters_state_is_kept_aside_and_saved() -> None:
    model, opt, data = trained()
    model.body.weight.requires_grad_(False)
    run(model, opt, data, 2)
    state = opt.state_dict()
    model2 = TwoHeads()
    model2.use_b = True
    model2.load_state_dict(model.state_dict())
    model2.body.weight.requires_grad_(False)
    opt2 = make(model2)
    opt2.load_state_dict(through_file(state))
    model.body.weight.requires_grad_(True)
    model2.body.weight.requires_grad_(True)
    assert run(model2, opt2, data, 3) == run(model, opt, data, 3)


def tampered_states(state):
    """(what was done, a copy of state with it done, the message expected)."""
    def copy_of():
        return through_file(state, weights_only=True)

    def with_change(change):
        s = copy_of()
        change(s)
        return s

    nan = float("nan")
    cases = [
        ("NaN in exp_avg", lambda s: s["state"][0]["exp_avg"].view(-1).__setitem__(0, nan), "exp_avg|finite"),
        ("infinite exp_avg_sq", lambda s: s["state"][1]["exp_avg_sq"].view(-1).__setitem__(0, float("inf")), "exp_avg_sq|finite"),
        ("negative exp_avg_sq", lambda s: s["state"][1]["exp_avg_sq"].view(-1).__setitem__(0, -1.0), "exp_avg_sq|negative"),
        ("wrong shape", lambda s: s["state"][0].__setitem__("exp_avg", torch.zeros(3)), r"\['state'\]\[0\]\['exp_avg'\]"),
        ("float64 slot", lambda s: s["state"][0].__setitem__("exp_avg", s["state"][0]["exp_avg"].double()), "float32"),
        ("missing entry", lambda s: s["state"].pop(2), r"state'\]\[2\]: missing"),
        ("unknown slot", lambda s: s["state"][1].__setitem__("momentum_buffer", torch.zeros(1)), "unknown keys"),
        ("a slot the optimizer does not keep", lambda s: s["state"][0].__setitem__("momentum_buffer", torch.zeros_like(s["state"][0]["exp_avg"])), "momentum_buffer"),
        ("negative step", lambda s: s["state"][0].__setitem__("step", torch.tensor(-1)), "step"),
        ("step past the engine's", lambda s: s["state"][0].__setitem__("step", torch.tensor(10**6)), "step"),
        ("float step", lambda s: s["state"][0].__setitem__("step", torch.tensor(1.5)), "step"),
        ("trainable out of range", lambda s: s["optex"].__setitem__("trainable", torch.tensor([0, 99])), "trainable"),
        ("trainable unsorted", lambda s: s["optex"].__setitem__("trainable", torch.tensor([1, 0])), "trainable"),
        ("trainable as a list", lambda s: s["optex"].__setitem__("trainable", [0, 1]), "trainable"),
        ("wrong format", lambda s: s["optex"].__setitem__("format", 99), "format"),
        ("unknown optex key", lambda s: s["optex"].__setitem__("extra", 1), "unknown keys"),
        ("no engine", lambda s: s["optex"].pop("engine"), "engine"),
        ("NaN iterate", lambda s: s["optex"]["engine"]["x"].__setitem__(0, nan), "x"),
        ("iterate too short", lambda s: s["optex"]["engine"].__setitem__("x", s["optex"]["engine"]["x"][:-1]), "x"),
        ("NaN in the history", lambda s: s["optex"]["engine"]["history"]["gradients"].view(-1).__setitem__(0, nan),
         "gradients"),
        ("a group too few", lambda s: s["param_groups"].pop(), "param"),
    ]
    for what, change, message in cases:
        yield what, with_change(change), message


def test_every_malformed_state_is_refused_and_changes_nothing() -> None:
    model, opt, data = trained()
    good = opt.state_dict()
    reference_model, reference, _ = trained()
    expected = run(reference_model, reference, data, 2)
    for what, state, message in tampered_states(good):
        with pytest.raises(ValueError, match=message):
            opt.load_state_dict(state)
            pytest.fail(f"{what}: accepted")
    assert [g["lr"] for g in opt.param_groups] == [0.02, 0.05]
    assert run(model, opt, data, 2) == expected


def test_a_torch_optim_state_is_not_mistaken_for_ours() -> None:
    model, opt, _ = trained()
    theirs = torch.optim.AdamW([{"params": [*model.body.parameters(), *model.a.parameters()]},
                                {"params": list(model.b.parameters())}])
    model(torch.zeros(1, 4)).sum().backward()
    theirs.step()
    with pytest.raises(ValueError, match="not an optex.torch.OptEx state"):
        opt.load_state_dict(theirs.state_dict())
