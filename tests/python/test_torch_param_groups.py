"""optex.torch.OptEx keeps torch.optim's conventions for parameter groups: each group's
own hyperparameters and LR schedule, groups added at any time, frozen and unused
parameters neither stepped nor decayed, a step count per parameter.

With parallelism=1 a round is one step of the base optimizer, so the trajectory must
follow torch.optim's own optimizer through every one of these events; with N > 1 the
engine's per-range hyperparameters must equal the manual ask/tell loop bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

import optex  # noqa: E402
from optex.torch import OptEx  # noqa: E402
from torch_models import TwoHeads, bits, closure_for, flat, loss_of, make_data, torch_step  # noqa: E402

TOLERANCE = dict(rtol=0.0, atol=2e-5)  # float32 rounding of two implementations over a few steps


def groups_of(model: TwoHeads, **extra) -> list[dict]:
    """Weights with decay, biases without, and a faster head a."""
    weights = [model.body.weight, model.b.weight]
    biases = [model.body.bias, model.a.bias, model.b.bias]
    return [
        {"params": weights, "weight_decay": 0.1, **extra},
        {"params": biases, "weight_decay": 0.0, **extra},
        {"params": [model.a.weight], "lr": 0.05, "weight_decay": 0.1, **extra},
    ]


def side_by_side(make_ours, make_theirs, events=None, steps: int = 12, seed: int = 0):
    """Runs ours (N = 1) and torch.optim's optimizer on two copies of one model;
    ``events(t, model, opt)`` changes both runs alike before step t. Returns the
    two models, checked to agree after every step."""
    data = make_data()
    ours_model, theirs_model = TwoHeads(seed), TwoHeads(seed)
    ours, theirs = make_ours(ours_model), make_theirs(theirs_model)
    closure = closure_for(ours, ours_model, data)
    for t in range(steps):
        if events is not None:
            events(t, ours_model, ours)
            events(t, theirs_model, theirs)
        ours.step(closure)
        torch_step(theirs, theirs_model, data)
        torch.testing.assert_close(flat(ours_model.parameters()), flat(theirs_model.parameters()),
                                   **TOLERANCE, msg=f"step {t}")
    return ours_model, theirs_model


@pytest.mark.parametrize("name", ["adamw", "adam", "sgd"])
def test_each_group_has_its_own_hyperparameters_as_in_torch_optim(name) -> None:
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD}[name]
    extra = {"momentum": 0.9} if name == "sgd" else {"betas": (0.8, 0.99)}
    ours_model, _ = side_by_side(
        lambda m: OptEx(groups_of(m, **extra), optimizer=name, lr=0.02, parallelism=1),
        lambda m: cls(groups_of(m, **extra), lr=0.02, foreach=False))
    assert ours_model.b.weight.grad is None  # head b is unused: never had a gradient


def test_per_group_lr_schedules_follow_torch_optim() -> None:
    def scheduled(opt):
        return torch.optim.lr_scheduler.LambdaLR(
            opt, [lambda t: 0.9 ** t, lambda t: 1.0, lambda t: 1.0 / (1 + t)])

    schedulers = {}

    def events(t, model, opt):
        if t == 0:
            schedulers[id(opt)] = scheduled(opt)
        else:
            schedulers[id(opt)].step()

    side_by_side(lambda m: OptEx(groups_of(m), optimizer="adamw", lr=0.02, parallelism=1),
                 lambda m: torch.optim.AdamW(groups_of(m), lr=0.02, foreach=False), events)


def test_a_group_added_mid_training_starts_its_own_state_as_in_torch_optim() -> None:
    def params(m):
        return [{"params": [*m.body.parameters(), *m.a.parameters()], "weight_decay": 0.05}]

    def events(t, model, opt):
        if t == 5:
            model.use_b = True
            opt.add_param_group({"params": list(model.b.parameters()), "lr": 0.03})

    ours_model, _ = side_by_side(lambda m: OptEx(params(m), optimizer="adamw", lr=0.01, parallelism=1),
                                 lambda m: torch.optim.AdamW(params(m), lr=0.01, foreach=False), events)
    assert ours_model.b.weight.grad is not None


def test_frozen_then_unfrozen_parameters_follow_torch_optim() -> None:
    """requires_grad=False from the start (never stepped, then a fresh state) and a
    layer frozen mid-run (its state kept aside, then resumed)."""
    initial_b = None

    def events(t, model, opt):
        nonlocal initial_b
        if t == 0:
            model.use_b = True
            for p in model.b.parameters():
                p.requires_grad_(False)
            initial_b = bits(flat(model.b.parameters()))
        if t == 3:
            model.body.weight.requires_grad_(False)
        if t == 6:
            for p in model.b.parameters():
                p.requires_grad_(True)
        if t == 9:
            model.body.weight.requires_grad_(True)

    def frozen_b_unchanged(m):
        return bits(flat(m.b.parameters())) == initial_b

    ours_model, theirs_model = side_by_side(
        lambda m: OptEx(m.parameters(), optimizer="adamw", lr=0.02, weight_decay=0.1, parallelism=1),
        lambda m: torch.optim.AdamW(m.parameters(), lr=0.02, weight_decay=0.1, foreach=False), events)
    assert not frozen_b_unchanged(ours_model)  # stepped after it was unfrozen


def test_a_parameter_unused_for_a_while_follows_torch_optim() -> None:
    def events(t, model, opt):
        model.use_b = 4 <= t < 8

    side_by_side(lambda m: OptEx(m.parameters(), optimizer="adamw", lr=0.02, weight_decay=0.1,
                                 parallelism=1),
                 lambda m: torch.optim.AdamW(m.parameters(), lr=0.02, weight_decay=0.1, foreach=False),
                 events)


# ---------------------------------------------------------------------------- N > 1


def manual_ranges_run(params, ranges, loss_fn, steps, **options) -> optex.OptEx:
    """The reference: the engine with per-range hyperparameters driven by hand."""
    engine = optex.OptEx(flat(params).numpy(), optimizer=ranges, **options)
    sizes = [p.numel() for p in params]
    for _ in range(steps):
        points = engine.ask()
        grads = np.empty(points.shape, np.float32)
        losses = np.empty(points.shape[0], np.float64)
        for i in range(points.shape[0]):
            with torch.no_grad():
                for p, piece in zip(params, torch.from_numpy(np.array(points[i])).split(sizes)):
                    p.copy_(piece.view(p.shape))
                    p.grad = None
            loss = loss_fn()
            loss.backward()
            grads[i] = flat([p.grad for p in params]).numpy()
            losses[i] = loss.item()
        engine.tell(grads, losses)
    return engine


def test_groups_are_the_engines_ranges_bit_for_bit() -> None:
    data = make_data()
    model = TwoHeads()
    model.use_b = True
    opt = OptEx(groups_of(model), optimizer="adamw", lr=0.02, parallelism=4, history=8, seed=3)
    closure = closure_for(opt, model, data)
    for _ in range(5):
        opt.step(closure)

    reference = TwoHeads()
    reference.use_b = True
    groups = groups_of(reference)
    order = [p for g in groups for p in g["params"]]
    ranges = [(sum(p.numel() for p in g["params"]),
               optex.AdamW(lr=g.get("lr", 0.02), weight_decay=g["weight_decay"])) for g in groups]
    engine = manual_ranges_run(order, ranges, lambda: loss_of(reference, data), 5,
                               parallelism=4, history=8, seed=3)
    assert bits(flat(p for g in groups_of(model) for p in g["params"])) == engine.x.tobytes()


def test_frozen_and_unused_parameters_keep_their_values_bit_for_bit_with_n_rounds() -> None:
    """AdamW with weight decay would move them if they were stepped; the trainable
    ones follow the engine run over the trainable parameters alone."""
    data = make_data()
    model = TwoHeads()
    model.body.bias.requires_grad_(False)  # frozen; b is unused (use_b False)
    frozen, unused = bits(model.body.bias), bits(flat(model.b.parameters()))
    opt = OptEx(model.parameters(), optimizer="adamw", lr=0.02, weight_decay=0.1, parallelism=4,
                history=8, seed=5)
    closure = closure_for(opt, model, data)
    for _ in range(6):
        opt.step(closure)
    assert bits(model.body.bias) == frozen
    assert bits(flat(model.b.parameters())) == unused
    state = opt.state_dict()["state"]
    index = {id(p): i for i, p in enumerate(model.parameters())}
    for p in model.b.parameters():  # in the engine, never stepped: zero state, step 0
        entry = state[index[id(p)]]
        assert int(entry["step"]) == 0
        assert not entry["exp_avg"].any() and not entry["exp_avg_sq"].any()
    assert index[id(model.body.bias)] not in state  # never trainable: no state, as torch.optim
    assert int(state[index[id(model.a.weight)]]["step"]) > 0


def test_a_closure_that_never_calls_backward_raises_and_changes_nothing() -> None:
    data = make_data()
    model = TwoHeads()
    opt = OptEx(model.parameters(), lr=0.02, parallelism=3)
    opt.step(closure_for(opt, model, data))
    before = bits(flat(model.parameters()))

    def forgetful():
        opt.zero_grad()
        return loss_of(model, data)  # no backward()

    with pytest.raises(ValueError, match=r"no trainable parameter received a gradient.*loss.backward\(\)"):
        opt.step(forgetful)
    assert opt.engine.pending and opt.engine.iteration == 1
    assert bits(flat(model.parameters())) == before
    opt.step(closure_for(opt, model, data))  # the same round, now with gradients
    assert opt.engine.iteration == 2 and not opt.engine.pending


def test_float64_parameters_are_refused_with_the_remedy() -> None:
    model = TwoHeads().double()
    with pytest.raises(ValueError, match=r"float64 parameters are not supported.*\.float\(\)"):
        OptEx(model.parameters())
    opt = OptEx(TwoHeads().parameters())
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]\[0\]: float64"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))]})
    assert len(opt.param_groups) == 1


def test_add_param_group_after_steps_keeps_the_run_and_restarts_the_history() -> None:
    data = make_data()
    model = TwoHeads()
    opt = OptEx([*model.body.parameters(), *model.a.parameters()], lr=0.02, parallelism=4, history=6)
    closure = closure_for(opt, model, data)
    for _ in range(4):
        opt.step(closure)
    engine = opt.engine
    assert engine.state_arrays()["history"]["size"] > 0
    before_b = bits(flat(model.b.parameters()))
    model.use_b = True
    opt.add_param_group({"params": list(model.b.parameters())})
    opt.step(closure)
    assert opt.engine is not engine and opt.engine.dim == sum(p.numel() for p in model.parameters())
    assert opt.engine.iteration == 5  # the round count goes on
    assert bits(flat(model.b.parameters())) != before_b
    twice = torch.nn.Parameter(torch.zeros(2))
    with pytest.warns(UserWarning, match="duplicate parameters"), \
            pytest.raises(ValueError, match="contains the same parameter twice"):
        opt.add_param_group({"params": [twice, twice]})
    with pytest.raises(ValueError, match="some parameters appear in more than one parameter group"):
        opt.add_param_group({"params": [model.a.bias]})
    with pytest.raises(ValueError, match=r"param_groups\[2\]: lr"):
        opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(2))], "lr": float("nan")})
    assert len(opt.param_groups) == 2


def test_no_trainable_parameter_at_all_is_a_clear_error() -> None:
    model = TwoHeads()
    opt = OptEx(model.parameters(), parallelism=2)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no parameter requires grad"):
        opt.step(lambda: torch.tensor(0.0))
    assert opt.engine is None


def group_keys(opt) -> list:
    return [{k: ([id(p) for p in v] if k == "params" else v) for k, v in g.items()} for g in opt.param_groups]


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_add_param_group_refuses_an_empty_group_and_other_optimizers_keys(optimizer) -> None:
    data = make_data()
    model = TwoHeads()
    opt = OptEx([*model.body.parameters(), *model.a.parameters()], optimizer=optimizer, lr=0.02)
    opt.step(closure_for(opt, model, data))
    before = repr(group_keys(opt))
    new = list(model.b.parameters())
    with pytest.raises(ValueError, match=r"param_groups\[1\]\['params'\]: has no parameters"):
        opt.add_param_group({"params": []})
    with pytest.raises(ValueError, match=r"param_groups\[1\]: has no 'params'"):
        opt.add_param_group({"lr": 0.1})
    theirs = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[optimizer]([torch.zeros(1, requires_grad=True)])
    for key, value in theirs.state_dict()["param_groups"][0].items():
        if key not in opt.param_groups[0]:  # amsgrad, maximize, foreach, capturable, dampening...
            with pytest.raises(ValueError, match=rf"param_groups\[1\]: '{key}': not a key"):
                opt.add_param_group({"params": new, key: value})
    other = "momentum" if optimizer == "adam" else "betas"
    with pytest.raises(ValueError, match=rf"'{other}': not a key .* '{other}' is a hyperparameter of optimizer="):
        opt.add_param_group({"params": new, other: 0.5})
    assert repr(group_keys(opt)) == before
    with pytest.raises(ValueError, match=r"param_groups\[0\]\['params'\]: has no parameters"):
        OptEx([{"params": []}, {"params": new}])
    opt.add_param_group({"params": new, "lr": 0.05})  # still works
    model.use_b = True
    opt.step(closure_for(opt, model, data))


def test_a_hyperparameter_deleted_mid_run_is_a_value_error_naming_the_group_and_key() -> None:
    data = make_data()
    model = TwoHeads()
    opt = OptEx(groups_of(model), optimizer="adam", lr=0.02, parallelism=2)
    closure = closure_for(opt, model, data)
    opt.step(closure)
    betas = opt.param_groups[1].pop("betas")
    with pytest.raises(ValueError, match=r"param_groups\[1\]: has no betas"):
        opt.step(closure)
    with pytest.raises(ValueError, match=r"state_dict: param_groups\[1\]: has no betas"):
        opt.state_dict()
    assert opt.engine.iteration == 1 and not opt.engine.pending
    opt.param_groups[1]["betas"] = betas
    opt.param_groups[2]["amsgrad"] = True  # torch.optim.Adam's, which OptEx does not offer
    with pytest.raises(ValueError, match=r"param_groups\[2\]: 'amsgrad': not a key"):
        opt.step(closure)
    del opt.param_groups[2]["amsgrad"]
    for group in opt.param_groups:  # values may change (schedules): they take effect
        group["lr"] = 0.01
    opt.step(closure)
    assert opt.engine.iteration == 2
    assert all(entry[1].lr == pytest.approx(0.01) for entry in opt.engine.optimizer)


def test_a_users_own_group_keys_stay_and_round_trip_as_in_torch_optim() -> None:
    """Keys that are no optimizer's option (a label, timm's lr_scale) are the user's:
    torch.optim keeps them, and so does OptEx, through steps and a state_dict; only
    another optimizer's options are refused (they would be silently ignored)."""
    data = make_data()
    model = TwoHeads()
    labelled = [{**g, "name": f"group {i}", "lr_scale": 0.5} for i, g in enumerate(groups_of(model))]
    opt = OptEx(labelled, optimizer="adam", lr=0.02, parallelism=2)
    closure = closure_for(opt, model, data)
    for _ in range(2):
        opt.step(closure)
    assert [g["name"] for g in opt.param_groups] == ["group 0", "group 1", "group 2"]
    saved = opt.state_dict()
    assert [g["lr_scale"] for g in saved["param_groups"]] == [0.5, 0.5, 0.5]
    twin_model = TwoHeads()
    twin_model.load_state_dict(model.state_dict())
    twin = OptEx([{**g, "name": "other"} for g in groups_of(twin_model)], optimizer="adam", lr=0.02,
                 parallelism=2)
    twin.load_state_dict(saved)
    assert [g["name"] for g in twin.param_groups] == ["group 0", "group 1", "group 2"]
    twin.step(closure_for(twin, twin_model, data))
    opt.step(closure)
    assert bits(flat(twin_model.parameters())) == bits(flat(model.parameters()))
    with pytest.raises(ValueError, match=r"'amsgrad': not a key"):
        OptEx([{**groups_of(TwoHeads())[0], "amsgrad": False}], optimizer="adam", lr=0.02)
