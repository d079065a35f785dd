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


def test_hyperparameters_on_torch_optims_bounds_load_and_resume_bit_for_bit() -> None:
    """A state saved by a run that a schedule took to lr 0, with betas, eps and weight decay
    at torch.optim's bound 0 too, loads and continues as the run that saved it; at lr 0 the
    parameters stay."""
    model, opt, data = trained()
    for group in opt.param_groups:
        group.update(lr=0.0, betas=(0.0, 0.0), eps=0.0, weight_decay=0.0)
    state = through_file(opt.state_dict())
    assert [g["lr"] for g in state["param_groups"]] == [0.0, 0.0]
    model2 = TwoHeads()
    model2.use_b = True
    model2.load_state_dict(model.state_dict())
    opt2 = make(model2)
    opt2.load_state_dict(state)
    before = bits(flat(model.parameters()))
    assert run(model2, opt2, data, 3) == run(model, opt, data, 3) == before


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


# ------------------------------------------------------------------ only OptEx's own state_dicts load

def unchanged(opt):
    """What a refused load must leave alone: the state_dict's bytes, the param groups,
    the defaults and the counters."""
    groups = [{k: ([id(p) for p in v] if k == "params" else v) for k, v in g.items()}
              for g in opt.param_groups]
    return (through_bytes(opt.state_dict()), repr(groups), dict(opt.defaults), opt.iteration,
            None if opt.engine is None else opt.engine.iteration)


def params_of(model):
    return [[*model.body.parameters(), *model.a.parameters()], list(model.b.parameters())]


@pytest.mark.parametrize("cls", [torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD])
def test_a_torch_optim_state_saved_before_its_first_step_is_refused(cls) -> None:
    model, opt, data = trained()
    theirs = cls([{"params": params} for params in params_of(model)], lr=0.02)
    state = theirs.state_dict()
    assert state["state"] == {}
    before = unchanged(opt)
    # The message names what is missing, else what OptEx does not have.
    missing = [k for k in opt.param_groups[0] if k not in state["param_groups"][0]]
    keys = "|".join(missing or [k for k in state["param_groups"][0] if k not in opt.param_groups[0]])
    with pytest.raises(ValueError, match=rf"state_dict\['param_groups'\]\[0\]: .*({keys})"):
        opt.load_state_dict(state)
    assert unchanged(opt) == before
    run(model, opt, data, 1)


@pytest.mark.parametrize("optimizer", ["adam", "adamw", "sgd", "rmsprop", "lion"])
def test_the_param_group_keys_are_the_optimizers_and_nothing_else_loads(optimizer) -> None:
    from optex.torch import hyperparameters
    model = TwoHeads()
    opt = make(model, optimizer=optimizer)
    state = opt.state_dict()
    for group in state["param_groups"]:
        assert set(group) == {"params", *hyperparameters.GROUP_KEYS[optimizer]}
    opt.load_state_dict(through_file(state))  # its own loads
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD, torch.optim.RMSprop):
        for key, value in cls([torch.zeros(1, requires_grad=True)]).state_dict()["param_groups"][0].items():
            if key in state["param_groups"][1]:
                continue
            bad = through_file(state)
            bad["param_groups"][1][key] = value
            with pytest.raises(ValueError, match=rf"param_groups'\]\[1\]: '{key}': not a key"):
                opt.load_state_dict(bad)


@pytest.mark.parametrize("change,message", [
    (lambda g: g.__setitem__("lr", float("nan")), r"\[1\]: lr: must be finite"),
    (lambda g: g.__setitem__("lr", -0.1), r"\[1\]: lr: must be finite and >= 0"),
    (lambda g: g.__setitem__("lr", "0.1"), r"\[1\]: lr: must be a real number"),
    (lambda g: g.__setitem__("lr", torch.tensor(0.1, device="meta")), r"\[1\]: lr: must be a number"),
    (lambda g: g.__setitem__("betas", (0.9, 1.0)), r"\[1\]: betas\[1\]: must be in \[0, 1\)"),
    (lambda g: g.__setitem__("betas", (-0.1, 0.9)), r"\[1\]: betas\[0\]"),
    (lambda g: g.__setitem__("betas", 0.9), r"\[1\]: betas: must be a pair"),
    (lambda g: g.__setitem__("eps", float("inf")), r"\[1\]: eps: must be finite and >= 0, got inf"),
    (lambda g: g.__setitem__("eps", -1e-8), r"\[1\]: eps"),
    (lambda g: g.__setitem__("weight_decay", None), r"\[1\]: weight_decay: must be a real number"),
    (lambda g: g.pop("eps"), r"\[1\]: has no eps"),
])
@pytest.mark.parametrize("saved_after_steps", [False, True])
def test_invalid_hyperparameters_are_refused_at_load_and_change_nothing(change, message,
                                                                        saved_after_steps) -> None:
    model, opt, data = trained()
    state = opt.state_dict() if saved_after_steps else make(TwoHeads()).state_dict()
    assert bool(state["state"]) == saved_after_steps
    change(state["param_groups"][1])
    before = unchanged(opt)
    with pytest.raises(ValueError, match=r"state_dict\['param_groups'\]" + message):
        opt.load_state_dict(state)
    assert unchanged(opt) == before
    run(model, opt, data, 1)


def test_a_slot_of_the_right_size_but_the_wrong_shape_is_refused() -> None:
    model, opt, data = trained()
    before = unchanged(opt)
    for shape in [(-1,), (2, -1), (1, 6, 4)]:
        state = opt.state_dict()
        state["state"][0]["exp_avg"] = state["state"][0]["exp_avg"].reshape(*shape).clone()
        with pytest.raises(ValueError, match=r"\['state'\]\[0\]\['exp_avg'\]: must be a torch.float32 "
                                             r"tensor of shape \(6, 4\)"):
            opt.load_state_dict(state)
    assert unchanged(opt) == before


@pytest.mark.parametrize("where", ["slot", "step", "trainable", "x", "history"])
@pytest.mark.parametrize("form", ["meta", "sparse"])
def test_meta_and_sparse_tensors_are_value_errors(where, form) -> None:
    model, opt, data = trained()
    before = unchanged(opt)
    state = opt.state_dict()
    engine = state["optex"]["engine"]
    holder, key = {"slot": (state["state"][0], "exp_avg"), "step": (state["state"][0], "step"),
                   "trainable": (state["optex"], "trainable"), "x": (engine, "x"),
                   "history": (engine["history"], "points")}[where]
    value = holder[key]
    holder[key] = value.to("meta") if form == "meta" else (value if value.dim() else value.reshape(1)).to_sparse()
    with pytest.raises(ValueError, match=rf"\['{key}'\]: must be .*" + ("meta" if form == "meta" else "sparse")):
        opt.load_state_dict(state)
    assert unchanged(opt) == before


@pytest.mark.parametrize("what,change,message", [
    ("an index of no parameter", lambda s: s["state"].__setitem__(6, dict(s["state"][5])), r"key 6 is not a parameter index"),
    ("a negative index", lambda s: s["state"].__setitem__(-1, dict(s["state"][5])), r"key -1 is not a parameter index"),
    ("a str index", lambda s: s["state"].__setitem__("0", dict(s["state"][0])), r"key '0' is not a parameter index"),
    ("an unknown top-level key", lambda s: s.__setitem__("scheduler", {}), r"state_dict: unknown keys 'scheduler'"),
    ("slots in the engine entry", lambda s: s["optex"]["engine"].__setitem__("slots", {}), r"\['engine'\]: unknown keys \['slots'\]"),
    ("repeated params", lambda s: s["param_groups"][1].__setitem__("params", [0, 1]), r"\[1\]\['params'\]: must be the parameter indices \[4, 5\]"),
    ("shifted params", lambda s: s["param_groups"][0].__setitem__("params", [1, 2, 3, 4]), r"\[0\]\['params'\]: must be the parameter indices \[0, 1, 2, 3\]"),
    ("foreign params", lambda s: s["param_groups"][1].__setitem__("params", [140234, 140235]), r"\[1\]\['params'\]: must be"),
    ("params as tensors", lambda s: s["param_groups"][1].__setitem__("params", [torch.tensor(4), torch.tensor(5)]), r"\[1\]\['params'\]: must be"),
    ("no params", lambda s: s["param_groups"][1].pop("params"), r"\[1\]: has no 'params'"),
    ("an unknown param-group key", lambda s: s["param_groups"][0].__setitem__("lr_decay", 0.1), r"'lr_decay': not a key"),
])
def test_entries_and_indices_optex_would_not_write_are_refused(what, change, message) -> None:
    model, opt, data = trained()
    before = unchanged(opt)
    state = opt.state_dict()
    change(state)
    with pytest.raises(ValueError, match=message):
        opt.load_state_dict(state)
        pytest.fail(f"{what}: accepted")
    assert unchanged(opt) == before
    run(model, opt, data, 1)


def frozen_state():
    """A state_dict with parameter 0 (body.weight) frozen and its state kept aside."""
    model, opt, data = trained()
    model.body.weight.requires_grad_(False)
    run(model, opt, data, 1)
    state = opt.state_dict()
    assert 0 not in state["optex"]["trainable"].tolist() and 0 in state["state"]
    return model, opt, data, state


@pytest.mark.parametrize("change,message", [
    (lambda e: e.__setitem__("extra", torch.zeros(1)), r"\[0\]: unknown keys \['extra'\]"),
    (lambda e: e.__setitem__("step", torch.tensor(10**6)), r"\[0\]\['step'\]: must be in \[0, "),
    (lambda e: e["exp_avg_sq"].view(-1).__setitem__(0, -1.0), r"\[0\]: the state kept aside .* cannot be taken back"),
    (lambda e: e.__setitem__("exp_avg", e["exp_avg"].reshape(-1).clone()), r"\[0\]\['exp_avg'\]: must be"),
    (lambda e: e.__setitem__("exp_avg", e["exp_avg"].to("meta")), r"\[0\]\['exp_avg'\]: must be .*meta"),
])
def test_a_malformed_state_kept_aside_for_a_frozen_parameter_is_refused(change, message) -> None:
    model, opt, data, state = frozen_state()
    change(state["state"][0])
    before = unchanged(opt)
    with pytest.raises(ValueError, match=r"state_dict\['state'\]" + message):
        opt.load_state_dict(state)
    assert unchanged(opt) == before
    model.body.weight.requires_grad_(True)  # it returns with its own state
    run(model, opt, data, 1)


def test_an_optimizer_state_no_step_can_be_taken_from_is_refused() -> None:
    """Needs the engine's check that a step can be taken from a loaded state
    (optex.OptEx.from_state_arrays, src/engine/steppable_state.cpp)."""
    model, opt, data = trained(optimizer="adam")
    before = unchanged(opt)
    state = opt.state_dict()
    state["state"][0]["exp_avg"].fill_(3e38)
    with pytest.raises(ValueError, match="state_dict"):
        opt.load_state_dict(state)
    assert unchanged(opt) == before
    run(model, opt, data, 1)


def test_lr_schedulers_and_named_parameters_round_trip() -> None:
    """The keys torch.optim and its LR schedulers write into param groups load back."""
    model, opt, data = trained(optimizer="adam")
    schedulers = [torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.05, total_steps=20),  # betas too
                  torch.optim.swa_utils.SWALR(opt, swa_lr=0.01)]
    run(model, opt, data, 1)
    for scheduler in schedulers:
        scheduler.step()
    state = through_file(opt.state_dict())
    assert {"initial_lr", "max_lr", "min_lr", "max_momentum", "base_momentum", "swa_lr"} <= set(state["param_groups"][0])
    opt.load_state_dict(state)
    run(model, opt, data, 1)

    named = OptEx(TwoHeads().named_parameters(), optimizer="adam", lr=0.01)
    state = named.state_dict()
    assert state["param_groups"][0]["param_names"][0] == "body.weight"
    named.load_state_dict(state)
    state["param_groups"][0]["param_names"] = ["body.weight"]
    with pytest.raises(ValueError, match=r"\['param_names'\]: must be a list of 6 str"):
        named.load_state_dict(state)


def test_a_load_leaves_the_defaults_so_later_groups_get_the_same_keys() -> None:
    model = TwoHeads()
    model.use_b = True
    opt = OptEx([{"params": [*model.body.parameters(), *model.a.parameters()]}], lr=0.02)
    opt.load_state_dict(opt.state_dict())
    opt.add_param_group({"params": list(model.b.parameters())})
    assert set(opt.param_groups[1]) == set(opt.param_groups[0])
    opt.load_state_dict(opt.state_dict())
