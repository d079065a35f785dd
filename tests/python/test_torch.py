"""optex.torch.OptEx, the torch.optim.Optimizer, against the ask/tell engine it wraps.

Needs PyTorch, which the test command installs (the `torch` extra); without it these
skip with the reason.
"""

from __future__ import annotations

import io
import os
import re
import runpy
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

import optex  # noqa: E402
import optex.torch  # noqa: E402
from optex.torch import OptEx  # noqa: E402
from conftest import require_torch_cuda  # noqa: E402
from torch_models import step_failing_on_rank_1  # noqa: E402

# ---------------------------------------------------------------------------- helpers


def make_model(seed: int = 0, device: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A small MLP with a deterministic initialisation."""
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 2))
    return model.to(device=device, dtype=dtype)


def make_data(device: str = "cpu", dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(16, 4, generator=g)
    y = torch.randn(16, 2, generator=g)
    return x.to(device=device, dtype=dtype), y.to(device=device, dtype=dtype)


def loss_of(model: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = data
    return ((model(x) - y) ** 2).mean()


def closure_for(opt: torch.optim.Optimizer, model: torch.nn.Module, data, record=None):
    def closure():
        opt.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        if record is not None:
            record.append(
                (opt.current_point, opt.current_seed,
                 torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone())
            )
        return loss

    return closure


def flat(params) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in params])


def manual_run(params: list[torch.Tensor], loss_fn, steps: int, optimizer, schedule=None,
               **options) -> optex.OptEx:
    """The reference: optex.OptEx ask/tell on the flattened parameters (in the given
    order), evaluating each point by writing it into the parameters. `schedule(t)`,
    when given, is the optimizer of step t (set with set_optimizer)."""
    device = params[0].device
    engine = optex.OptEx(flat(params).cpu().numpy(), optimizer=optimizer, **options)
    sizes = [p.numel() for p in params]
    for t in range(steps):
        if schedule is not None:
            engine.set_optimizer(schedule(t))
        points = engine.ask()
        n, d = points.shape
        grads = np.empty((n, d), np.float32)
        losses = np.empty(n, np.float64)
        for i in range(n):
            pieces = torch.from_numpy(np.array(points[i])).to(device).split(sizes)
            with torch.no_grad():
                for p, piece in zip(params, pieces):
                    p.copy_(piece.view(p.shape))
                    p.grad = None
            loss = loss_fn()
            loss.backward()
            grads[i] = flat([p.grad for p in params]).cpu().numpy()
            losses[i] = loss.item()
        engine.tell(grads, losses)
    return engine


def bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().numpy().tobytes()


@contextmanager
def one_thread():
    """Single-threaded torch (the distributed workers use one thread too)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


OPTIMIZERS = [
    ("adam", {}, optex.Adam(lr=0.01)),
    ("adamw", {}, optex.AdamW(lr=0.01)),
    ("adamw", {"weight_decay": 0.1, "betas": (0.8, 0.99), "eps": 1e-6},
     optex.AdamW(lr=0.01, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1)),
    ("sgd", {"momentum": 0.9, "nesterov": True}, optex.Sgd(lr=0.01, momentum=0.9, nesterov=True)),
]

# ---------------------------------------------------------------------------- step


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(("name", "hyper", "engine_optimizer"), OPTIMIZERS)
def test_step_equals_the_manual_ask_tell_loop_bit_for_bit(n, name, hyper, engine_optimizer) -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), optimizer=name, lr=0.01, parallelism=n, history=8, seed=4, **hyper)
    closure = closure_for(opt, model, data)
    losses = [opt.step(closure) for _ in range(5)]

    reference = make_model()
    engine = manual_run(list(reference.parameters()), lambda: loss_of(reference, data), 5,
                        engine_optimizer, parallelism=n, history=8, seed=4)
    assert bits(flat(model.parameters())) == engine.x.tobytes()
    assert opt.engine.iteration == engine.iteration == 5
    assert opt.engine.optimizer == engine_optimizer
    assert all(isinstance(loss, torch.Tensor) and loss.ndim == 0 for loss in losses)
    assert losses[-1].item() == opt.last_info.loss


def test_the_returned_loss_is_the_closures_loss_at_the_committed_point() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.01, parallelism=3)
    returned = []

    def closure():
        opt.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        returned.append(loss)
        return loss

    loss = opt.step(closure)
    assert opt.last_info.committed_point == 2
    # Its value, dtype and device, as a copy taken when the closure returned it
    # (test_torch_closure_memory.py: a closure may reuse its loss tensor).
    assert loss is not returned[2] and not loss.requires_grad
    assert loss.dtype == returned[2].dtype and loss.device == returned[2].device
    assert bits(loss) == bits(returned[2])


def test_parameters_hold_each_point_during_the_closure_and_the_iterate_after() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=4, seed=7)
    record = []
    closure = closure_for(opt, model, data, record)
    reference = make_model()
    engine = optex.OptEx(flat(reference.parameters()).numpy(), optimizer=optex.Adam(lr=0.05),
                         parallelism=4, seed=7)
    for _ in range(3):
        record.clear()
        before = flat(model.parameters())
        opt.step(closure)
        points = np.array(engine.ask())
        seeds = engine.seeds
        # The closure saw the engine's N points, in order, with their seeds.
        assert [r[0] for r in record] == [0, 1, 2, 3]
        assert [r[1] for r in record] == [int(s) for s in seeds]
        for i, (_, _, seen) in enumerate(record):
            assert bits(seen) == points[i].tobytes()
        assert bits(before) == points[0].tobytes()  # the first point is the iterate
        # Reference gradients, then the committed iterate is in the parameters.
        grads = np.empty_like(points)
        losses = np.empty(4)
        for i in range(4):
            with torch.no_grad():
                torch.nn.utils.vector_to_parameters(torch.from_numpy(points[i]), reference.parameters())
            reference.zero_grad()
            loss = loss_of(reference, data)
            loss.backward()
            grads[i] = flat([p.grad for p in reference.parameters()]).numpy()
            losses[i] = loss.item()
        engine.tell(grads, losses)
        assert bits(flat(model.parameters())) == engine.x.tobytes()
    assert opt.current_point is None and opt.current_seed is None


def test_a_closure_that_raises_leaves_the_parameters_and_the_round_pending() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=3)
    closure = closure_for(opt, model, data)
    opt.step(closure)
    before = flat(model.parameters())
    calls = []

    def failing():
        calls.append(opt.current_point)
        if opt.current_point == 2:
            raise KeyError("simulated failure")
        return closure()

    with pytest.raises(KeyError, match="simulated failure"):
        opt.step(failing)
    assert bits(flat(model.parameters())) == bits(before)
    assert opt.engine.pending and opt.engine.iteration == 1
    with pytest.raises(RuntimeError, match="pending"):
        opt.state_dict()
    opt.step(closure)  # the same round, finished
    for _ in range(2):
        opt.step(closure)

    reference = make_model()
    engine = manual_run(list(reference.parameters()), lambda: loss_of(reference, data), 4,
                        optex.Adam(lr=0.05), parallelism=3)
    assert bits(flat(model.parameters())) == engine.x.tobytes()


def test_parallelism_one_follows_torch_optim() -> None:
    """N = 1 is the base optimizer: the engine's update rules are torch.optim's."""
    data = make_data()
    cases = [
        ("adam", {"weight_decay": 0.01}, lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.01)),
        ("adamw", {}, lambda ps: torch.optim.AdamW(ps, lr=0.01)),
        ("sgd", {"momentum": 0.9, "nesterov": True},
         lambda ps: torch.optim.SGD(ps, lr=0.01, momentum=0.9, nesterov=True)),
    ]
    for name, hyper, make_torch in cases:
        model = make_model()
        opt = OptEx(model.parameters(), optimizer=name, lr=0.01, parallelism=1, **hyper)
        closure = closure_for(opt, model, data)
        theirs = make_model()
        torch_opt = make_torch(theirs.parameters())
        for _ in range(20):
            opt.step(closure)
            torch_opt.zero_grad()
            loss_of(theirs, data).backward()
            torch_opt.step()
        torch.testing.assert_close(flat(model.parameters()), flat(theirs.parameters()),
                                   rtol=0.0, atol=1e-5, msg=name)


def test_target_proxy_is_n_sequential_steps() -> None:
    """proxy='target' calls the closure for the proxy steps: N x T sequential steps."""
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.02, parallelism=3, proxy="target")
    closure = closure_for(opt, model, data)
    for _ in range(2):
        opt.step(closure)
    sequential = make_model()
    engine = manual_run(list(sequential.parameters()), lambda: loss_of(sequential, data), 6,
                        optex.Adam(lr=0.02), parallelism=1)
    assert bits(flat(model.parameters())) == engine.x.tobytes()


def test_the_engine_starts_from_the_parameters_at_the_first_step() -> None:
    data = make_data()
    model = make_model(seed=0)
    opt = OptEx(model.parameters(), lr=0.01, parallelism=2)
    assert opt.engine is None and opt.last_info is None
    model.load_state_dict(make_model(seed=3).state_dict())  # weights loaded after construction
    opt.param_groups[0]["lr"] = 0.02  # hyperparameters may change before the first step
    opt.step(closure_for(opt, model, data))
    reference = make_model(seed=3)
    engine = manual_run(list(reference.parameters()), lambda: loss_of(reference, data), 1,
                        optex.Adam(lr=0.02), parallelism=2)
    assert bits(flat(model.parameters())) == engine.x.tobytes()


def test_parameters_changed_outside_step_raise() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.01, parallelism=2)
    closure = closure_for(opt, model, data)
    opt.step(closure)
    with torch.no_grad():
        model[2].bias.add_(1.0)
    with pytest.raises(RuntimeError, match="parameter 3 .*changed outside step"):
        opt.step(closure)
    with torch.no_grad():
        model[2].bias.sub_(1.0)
    # Restored to the committed values: steps again (bias - 1 + 1 may round, so set exactly).
    torch.nn.utils.vector_to_parameters(torch.from_numpy(opt.engine.x), model.parameters())
    opt.step(closure)
    assert opt.engine.iteration == 2


def test_an_lr_scheduler_equals_set_optimizer_in_the_manual_loop_bit_for_bit() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.01, parallelism=3, history=8, seed=2)
    closure = closure_for(opt, model, data)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(6):
        opt.step(closure)
        scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.01 / 8

    reference = make_model()
    engine = manual_run(list(reference.parameters()), lambda: loss_of(reference, data), 6,
                        optex.Adam(lr=0.01), schedule=lambda t: optex.Adam(lr=0.01 * 0.5 ** (t // 2)),
                        parallelism=3, history=8, seed=2)
    assert bits(flat(model.parameters())) == engine.x.tobytes()
    assert opt.engine.optimizer == optex.Adam(lr=0.01 / 4)  # the last step's value


def follow_cosine_schedule(make_ours, make_theirs) -> None:
    """Ten steps of ours (an optex.torch.OptEx with N = 1) and of torch.optim's optimizer on
    the same model, each under CosineAnnealingLR: the parameters agree."""
    data = make_data()
    model, theirs = make_model(), make_model()
    opt, torch_opt = make_ours(model.parameters()), make_theirs(theirs.parameters())
    closure = closure_for(opt, model, data)
    schedulers = [torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10) for o in (opt, torch_opt)]
    for _ in range(10):
        opt.step(closure)
        torch_opt.zero_grad()
        loss_of(theirs, data).backward()
        torch_opt.step()
        for s in schedulers:
            s.step()
    torch.testing.assert_close(flat(model.parameters()), flat(theirs.parameters()), rtol=0.0, atol=1e-5)


def test_an_lr_scheduler_with_parallelism_one_follows_torch_optim() -> None:
    follow_cosine_schedule(
        lambda p: OptEx(p, optimizer="sgd", lr=0.05, momentum=0.9, parallelism=1),
        lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9))


# ---------------------------------------------------------------------- lr 0 in schedules

# Schedules of torch.optim that reach lr 0 exactly: a linear warmup from 0 (lr 0 at the first
# step), and a cosine annealing to eta_min = 0 (lr 0 at T_max, then up again).
ZERO_LR_SCHEDULES = {
    "lambda_warmup": lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, s / 5)),
    "cosine_eta_min_0": lambda opt: torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6, eta_min=0.0),
}
# optex.torch.OptEx's keywords and the torch.optim optimizer with the same hyperparameters.
TORCH_TWINS = {
    "sgd_nesterov": (dict(optimizer="sgd", lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01),
                     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01,
                                               foreach=False)),
    "adam": (dict(optimizer="adam", lr=0.01, weight_decay=0.01),
             lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01, foreach=False)),
    "adamw": (dict(optimizer="adamw", lr=0.01, weight_decay=0.1),
              lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1, foreach=False)),
    "rmsprop": (dict(optimizer="rmsprop", lr=0.003, momentum=0.5, centered=True),
                lambda p: torch.optim.RMSprop(p, lr=0.003, momentum=0.5, centered=True, foreach=False)),
}


def assert_close_to_scale(ours: torch.Tensor, theirs: torch.Tensor, what: str) -> None:
    """Within 1e-6 of the largest magnitude (a few float32 ulps; test_optimizers_match_torch.py
    says why torch's fused multiply-adds keep bit equality out of reach)."""
    ours, theirs = ours.reshape(-1).double(), theirs.reshape(-1).double()
    scale = max(float(theirs.abs().max()), 1e-30)
    assert float((ours - theirs).abs().max()) <= 1e-6 * scale, what


@pytest.mark.parametrize("kind", TORCH_TWINS)
@pytest.mark.parametrize("schedule", ZERO_LR_SCHEDULES)
def test_a_schedule_through_lr_zero_follows_torch_optim_step_for_step(schedule, kind) -> None:
    """With parallelism 1, optex.torch.OptEx under a schedule that reaches lr 0 is
    torch.optim's optimizer under it: at lr 0 the parameters stay bit for bit (torch's do
    too), the state advances as torch's does (step count, moments, buffers)."""
    data = make_data()
    model, theirs = make_model(), make_model()
    kwargs, make_theirs = TORCH_TWINS[kind]
    opt = OptEx(model.parameters(), parallelism=1, **kwargs)
    torch_opt = make_theirs(theirs.parameters())
    schedulers = [ZERO_LR_SCHEDULES[schedule](o) for o in (opt, torch_opt)]
    closure = closure_for(opt, model, data)
    steps_at_zero = 0
    for t in range(14):
        lr = opt.param_groups[0]["lr"]
        assert lr == torch_opt.param_groups[0]["lr"]
        ours_before, theirs_before = bits(flat(model.parameters())), bits(flat(theirs.parameters()))
        opt.step(closure)
        torch_opt.zero_grad()
        loss_of(theirs, data).backward()
        torch_opt.step()
        if lr == 0.0:
            steps_at_zero += 1
            assert bits(flat(theirs.parameters())) == theirs_before  # torch.optim's step at lr 0
            assert bits(flat(model.parameters())) == ours_before, f"step {t} moved at lr 0"
        assert_close_to_scale(flat(model.parameters()), flat(theirs.parameters()), f"step {t}")
        ours_state, their_state = opt.state_dict()["state"], torch_opt.state_dict()["state"]
        assert ours_state.keys() == their_state.keys()
        for i, entry in their_state.items():
            for key, value in entry.items():
                if key == "step":
                    assert float(ours_state[i]["step"]) == float(value) == t + 1
                else:
                    assert_close_to_scale(ours_state[i][key], value, f"step {t} {key}[{i}]")
        for s in schedulers:
            s.step()
    assert steps_at_zero >= 1


def test_a_warmup_from_lr_zero_with_parallelism_runs_and_is_deterministic() -> None:
    """OptEx rounds at lr 0 (N gradients at the one point, pairs the GP's history takes at
    that point) keep the parameters bit for bit while the state advances, and the warmup
    that follows moves them, the same bits on a second run."""
    data = make_data()

    def run() -> tuple[bytes, dict]:
        model = make_model()
        opt = OptEx(model.parameters(), lr=0.02, parallelism=4, history=12, seed=3)
        scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, max(0, s - 3) / 5))
        start = bits(flat(model.parameters()))
        closure = closure_for(opt, model, data)
        steps = []
        for t in range(12):
            at_zero = opt.param_groups[0]["lr"] == 0.0
            opt.step(closure)
            steps.append(opt.engine.optimizer_step)
            if at_zero:
                assert bits(flat(model.parameters())) == start, f"round {t} moved at lr 0"
            scheduler.step()
        assert steps[3] > steps[2] > steps[1] > steps[0] >= 1  # the state advanced at lr 0
        assert bits(flat(model.parameters())) != start
        with torch.no_grad():
            assert float(loss_of(model, data)) < float(loss_of(make_model(), data))
        return bits(flat(model.parameters())), opt.state_dict()

    first, second = run(), run()
    assert first[0] == second[0]
    for i, entry in first[1]["state"].items():
        for key, value in entry.items():
            assert bits(torch.as_tensor(value)) == bits(torch.as_tensor(second[1]["state"][i][key]))


@pytest.mark.parametrize("bad", [-1e-3, float("nan"), float("inf"), -float("inf"), 1e39])
def test_a_scheduled_lr_torch_optim_refuses_is_refused_and_changes_nothing(bad) -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), optimizer="sgd", lr=0.05, momentum=0.9, parallelism=2, seed=1)
    closure = closure_for(opt, model, data)
    opt.step(closure)
    before, state = bits(flat(model.parameters())), opt.state_dict()
    opt.param_groups[0]["lr"] = bad
    with pytest.raises(ValueError, match=r"param_groups\[0\]: lr: must be "):
        opt.step(closure)
    assert bits(flat(model.parameters())) == before
    assert opt.engine.iteration == 1 and not opt.engine.pending
    opt.param_groups[0]["lr"] = 0.05  # (state_dict refuses a group it could not load)
    assert all(bits(state["state"][0][k]) == bits(v) for k, v in opt.state_dict()["state"][0].items())
    opt.param_groups[0]["lr"] = 0.0  # what a schedule may write: accepted, nothing moves
    opt.step(closure)
    assert opt.engine.iteration == 2 and bits(flat(model.parameters())) == before


# Each optimizer= name's torch.optim twin (Lion, not in torch.optim, takes AdamW's bounds) and
# the param-group keys with a bound ("betas[i]" is one element of the pair; "nesterov" is
# nesterov=True with the value as momentum, torch.optim.SGD's rule).
GROUP_BOUNDS = {
    "sgd": ("SGD", ("lr", "momentum", "weight_decay", "nesterov")),
    "adam": ("Adam", ("lr", "betas[0]", "betas[1]", "eps", "weight_decay")),
    "adamw": ("AdamW", ("lr", "betas[0]", "betas[1]", "eps", "weight_decay")),
    "rmsprop": ("RMSprop", ("lr", "alpha", "eps", "weight_decay", "momentum")),
    "lion": ("AdamW", ("lr", "betas[0]", "betas[1]", "weight_decay")),
}
GROUP_BOUNDARY_VALUES = (0.0, -1e-300, 0.999999, 1.0, 1.5, 3.4028234663852886e38, 1e39,
                         float("inf"), float("nan"), -1.0)


def group_setting(key: str, value: float) -> dict:
    """The param-group entries (and torch.optim keyword arguments) that set `key` to `value`."""
    if key.startswith("betas["):
        pair = [0.9, 0.99]
        pair[int(key[6])] = value
        return {"betas": tuple(pair)}
    if key == "nesterov":
        return {"momentum": value, "nesterov": True}
    return {key: value}


@pytest.mark.parametrize(("kind", "key", "value"), [
    pytest.param(kind, key, value, id=f"{kind}-{key}-{value!r}")
    for kind, (_, keys) in GROUP_BOUNDS.items() for key in keys for value in GROUP_BOUNDARY_VALUES])
def test_a_param_group_value_is_taken_or_refused_as_torch_optim_does(kind, key, value) -> None:
    """A value in a param group (what a scheduler or a user writes there) is taken by step
    where torch.optim's constructor takes it (and it is finite and within float32), and
    refused otherwise, naming the group and the key, with the parameters unchanged; then the
    run goes on (to lr 0, a schedule's end, where the value was taken)."""
    setting = group_setting(key, value)
    try:
        getattr(torch.optim, GROUP_BOUNDS[kind][0])([torch.zeros(1, requires_grad=True)], **setting)
        torch_accepts = True
    except ValueError:
        torch_accepts = False
    expected = torch_accepts and np.isfinite(value) and abs(value) <= 3.4028234663852886e38
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), optimizer=kind, lr=0.01, parallelism=2, seed=1)
    closure = closure_for(opt, model, data)
    start = bits(flat(model.parameters()))
    defaults = dict(opt.param_groups[0])
    opt.param_groups[0].update(setting)
    if not expected:
        name = "momentum" if key == "nesterov" else re.escape(key)
        with pytest.raises(ValueError, match=rf"^param_groups\[0\]: {name}: must be "):
            opt.step(closure)
        assert bits(flat(model.parameters())) == start
        opt.param_groups[0].update({k: defaults[k] for k in setting})
        opt.step(closure)
        assert opt.engine.iteration == 1
        return
    # Values torch.optim takes whose steps are not finite: the engine refuses those steps
    # (a value near float32's largest; RMSprop's alpha above 1, where the squared average
    # turns negative and its square root NaN).
    leaves_the_bounds = abs(value) >= 1e38 or ((kind, key) == ("rmsprop", "alpha") and value > 1.0)
    before = start
    try:
        opt.step(closure)
        assert opt.engine.iteration == 1
        opt.param_groups[0]["lr"] = 0.0
        before = bits(flat(model.parameters()))
        opt.step(closure)
    except RuntimeError as error:
        assert "can be committed" in str(error) and leaves_the_bounds
        assert bits(flat(model.parameters())) == before  # the refused step changed nothing
        return
    assert opt.engine.iteration == 2 and bits(flat(model.parameters())) == before


@pytest.mark.parametrize("lr", [0.1, 0.0])
def test_eps_zero_with_a_gradient_that_is_zero_from_the_start_is_refused_as_non_finite(lr) -> None:
    """torch.optim.Adam(eps=0) steps 0 / 0 there and writes NaN into the parameter (at lr 0
    too); the engine refuses the non-finite step, and nothing changes."""
    w, z = torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))

    def loss_fn():
        return (w ** 2).sum() + 0.0 * z.sum()  # z's gradient is exactly 0

    theirs = [torch.nn.Parameter(torch.ones(3)), torch.nn.Parameter(torch.ones(2))]
    torch_opt = torch.optim.Adam(theirs, lr=lr, eps=0.0, foreach=False)
    ((theirs[0] ** 2).sum() + 0.0 * theirs[1].sum()).backward()
    torch_opt.step()
    assert torch.isnan(theirs[1]).all()  # what torch.optim does
    opt = OptEx([w, z], optimizer="adam", lr=lr, eps=0.0, parallelism=2)

    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    with pytest.raises(RuntimeError, match="can be committed"):
        opt.step(closure)
    assert bits(flat([w, z])) == bits(torch.ones(5)) and opt.engine.iteration == 0


def test_a_hyperparameter_the_engine_cannot_take_raises_and_changes_nothing() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), optimizer="sgd", lr=0.01, parallelism=2)
    closure = closure_for(opt, model, data)
    opt.step(closure)
    before = bits(flat(model.parameters()))
    opt.param_groups[0]["momentum"] = 0.9  # the momentum buffer would appear mid-run
    with pytest.raises(ValueError, match="momentum: 0.9 cannot replace 0"):
        opt.step(closure)
    assert opt.engine.iteration == 1 and not opt.engine.pending
    assert bits(flat(model.parameters())) == before
    opt.param_groups[0]["momentum"] = 0.0
    opt.step(closure)
    assert opt.engine.iteration == 2


def test_a_parameter_without_gradient_is_not_stepped() -> None:
    data = make_data()
    model = make_model()
    frozen = torch.nn.Parameter(torch.ones(3))
    opt = OptEx([*model.parameters(), frozen], lr=0.05, parallelism=3)
    closure = closure_for(opt, model, data)
    for _ in range(3):
        opt.step(closure)
    assert torch.equal(frozen.detach(), torch.ones(3))  # Adam without weight decay: no move
    assert frozen.grad is None


def test_drop_nonfinite() -> None:
    data = make_data()
    model = make_model()

    def run(**kwargs):
        opt = OptEx(model.parameters(), lr=0.01, parallelism=3, **kwargs)

        def closure():
            opt.zero_grad()
            loss = loss_of(model, data)
            loss.backward()
            return loss * float("nan") if opt.current_point == 1 else loss

        return opt, closure

    opt, closure = run()
    with pytest.raises(ValueError, match="losses"):
        opt.step(closure)
    opt, closure = run(drop_nonfinite=True)
    opt.step(closure)
    assert opt.last_info.dropped == 1


def test_zero_grad() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.01, parallelism=2)
    opt.step(closure_for(opt, model, data))
    assert all(p.grad is not None for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    opt.step(closure_for(opt, model, data))
    opt.zero_grad(set_to_none=False)
    assert all(torch.count_nonzero(p.grad) == 0 for p in model.parameters())


# ---------------------------------------------------------------------------- base optimizers


def torch_values(cls, engine_optimizer) -> dict:
    """An engine optimizer's hyperparameters under torch.optim's names: each field
    by its own name, beta1 and beta2 as the pair 'betas' (the facade's rule,
    written out here independently of optex.torch)."""
    out = {}
    for name in cls.hyperparameters:
        if name in ("beta1", "beta2") and {"beta1", "beta2"} <= set(cls.hyperparameters):
            out["betas"] = (engine_optimizer.beta1, engine_optimizer.beta2)
        else:
            out[name] = getattr(engine_optimizer, name)
    return out


def non_default_values(cls) -> dict:
    """Engine keyword arguments that differ from the class's defaults wherever the
    class accepts a different value: lr 0.02, half of each positive real, 0.05 for
    each zero, each flag flipped (in constructor order, so that a flag that needs
    another field, like nesterov its momentum, sees that field changed first)."""
    defaults = cls()
    values: dict = {}
    for name in cls.hyperparameters:
        default = getattr(defaults, name)
        if name == "lr":
            candidate = 0.02
        elif isinstance(default, bool):
            candidate = not default
        else:
            candidate = default * 0.5 if default > 0 else 0.05
        try:
            cls(**values, **{name: candidate})
        except ValueError:
            continue
        values[name] = candidate
    return values


@pytest.mark.parametrize("cls", optex.optimizer_classes(), ids=lambda cls: cls.__name__)
def test_every_engine_optimizer_class_works_through_the_facade(cls) -> None:
    """Nothing in optex.torch names an optimizer: every class the library registers
    is an optimizer= name (its name in lower case), takes its hyperparameters under
    torch.optim's names and steps bit for bit as the engine with that optimizer."""
    name = cls.__name__.lower()
    engine_optimizer = cls(**non_default_values(cls))
    hyper = torch_values(cls, engine_optimizer)
    assert engine_optimizer != cls()  # the facade must pass every value on, not fall back
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), optimizer=name, parallelism=2, history=6, seed=3, **hyper)
    assert {key: opt.param_groups[0][key] for key in hyper} == hyper
    assert set(opt.param_groups[0]) == {"params", *hyper}
    closure = closure_for(opt, model, data)
    for _ in range(3):
        opt.step(closure)
    assert type(opt.engine.optimizer) is cls
    assert opt.engine.optimizer == engine_optimizer

    reference = make_model()
    engine = manual_run(list(reference.parameters()), lambda: loss_of(reference, data), 3,
                        engine_optimizer, parallelism=2, history=6, seed=3)
    assert bits(flat(model.parameters())) == engine.x.tobytes()

    # Checkpoints carry the optimizer through state_dict, whatever it is.
    resumed_model = make_model(seed=5)
    resumed_model.load_state_dict(model.state_dict())
    resumed = OptEx(resumed_model.parameters(), optimizer=name)
    resumed.load_state_dict(opt.state_dict())
    assert resumed.engine.optimizer == engine_optimizer
    resumed.step(closure_for(resumed, resumed_model, data))
    opt.step(closure)
    assert bits(flat(resumed_model.parameters())) == bits(flat(model.parameters()))


@pytest.mark.parametrize("cls", optex.optimizer_classes(), ids=lambda cls: cls.__name__)
def test_defaults_are_the_classes_own_except_lr(cls) -> None:
    model = make_model()
    opt = OptEx(model.parameters(), optimizer=cls.__name__.lower(), parallelism=1)
    expected = cls(lr=1e-3)  # the facade's lr default; every other value the class's
    assert opt.param_groups[0]["lr"] == 1e-3
    assert {k: v for k, v in opt.param_groups[0].items() if k != "params"} == torch_values(cls, expected)
    opt.step(closure_for(opt, model, make_data()))
    assert opt.engine.optimizer == expected


def test_the_defaults_of_adam_adamw_and_sgd_are_unchanged() -> None:
    def group(**kwargs):
        opt = OptEx(make_model().parameters(), **kwargs)
        return {k: v for k, v in opt.param_groups[0].items() if k != "params"}

    assert group() == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    assert group(optimizer="adam") == group()
    assert group(optimizer="adamw") == {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8,
                                        "weight_decay": 0.01}
    assert group(optimizer="sgd") == {"lr": 1e-3, "momentum": 0.0, "nesterov": False,
                                      "weight_decay": 0.0}
    assert group(optimizer="rmsprop") == {"lr": 1e-3, "alpha": 0.99, "eps": 1e-8, "weight_decay": 0.0,
                                          "momentum": 0.0, "centered": False}
    assert group(optimizer="lion") == {"lr": 1e-3, "betas": (0.9, 0.99), "weight_decay": 0.0}


def test_positional_hyperparameters_keep_their_order() -> None:
    model = make_model()
    # OptEx(params, optimizer, lr, betas, eps, weight_decay, momentum, nesterov)
    sgd = OptEx(model.parameters(), "sgd", 0.05, None, None, 0.001, 0.9, True, parallelism=1)
    adam = OptEx(model.parameters(), "adam", 0.02, (0.8, 0.99), 1e-6, 0.1, parallelism=1)
    for opt in (sgd, adam):
        opt.step(closure_for(opt, model, make_data()))
    assert sgd.engine.optimizer == optex.Sgd(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.001)
    assert adam.engine.optimizer == optex.Adam(lr=0.02, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.1)


@pytest.mark.parametrize("n", [1, 3])
@pytest.mark.parametrize(("name", "hyper", "engine_optimizer"), [
    ("rmsprop", {}, optex.RmsProp(lr=0.01)),
    ("rmsprop", {"alpha": 0.9, "momentum": 0.5, "eps": 1e-6},
     optex.RmsProp(lr=0.01, alpha=0.9, momentum=0.5, eps=1e-6)),
    ("rmsprop", {"centered": True}, optex.RmsProp(lr=0.01, centered=True)),
    ("rmsprop", {"centered": True, "momentum": 0.9, "weight_decay": 0.01},
     optex.RmsProp(lr=0.01, centered=True, momentum=0.9, weight_decay=0.01)),
    ("lion", {}, optex.Lion(lr=0.01)),
    ("lion", {"betas": (0.95, 0.98), "weight_decay": 0.1},
     optex.Lion(lr=0.01, beta1=0.95, beta2=0.98, weight_decay=0.1)),
])
def test_rmsprop_and_lion_equal_the_manual_ask_tell_loop_bit_for_bit(n, name, hyper, engine_optimizer) -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), optimizer=name, lr=0.01, parallelism=n, history=8, seed=4, **hyper)
    closure = closure_for(opt, model, data)
    for _ in range(5):
        opt.step(closure)
    assert opt.engine.optimizer == engine_optimizer

    reference = make_model()
    engine = manual_run(list(reference.parameters()), lambda: loss_of(reference, data), 5,
                        engine_optimizer, parallelism=n, history=8, seed=4)
    assert bits(flat(model.parameters())) == engine.x.tobytes()


def test_rmsprop_and_lion_groups_build_the_engine_optimizer() -> None:
    model = make_model()
    groups = [{"params": model[0].parameters()},
              {"params": model[2].parameters(), "centered": True, "momentum": 0.3}]
    opt = OptEx(groups, optimizer="rmsprop", lr=0.02, centered=True, momentum=0.3, alpha=0.95,
                parallelism=2)
    assert [g["alpha"] for g in opt.param_groups] == [0.95, 0.95]
    opt.step(closure_for(opt, model, make_data()))
    assert opt.engine.optimizer == optex.RmsProp(lr=0.02, alpha=0.95, momentum=0.3, centered=True)

    with pytest.raises(ValueError, match=r"param_groups\[1\]: betas\[1\]: must be in \[0, 1\), got 1"):
        OptEx([{"params": model[0].parameters()},
               {"params": model[2].parameters(), "betas": (0.9, 1.0)}], optimizer="lion")


def test_a_hyperparameter_the_optimizer_does_not_take_raises_naming_it() -> None:
    params = list(make_model().parameters())
    cases = [
        (dict(optimizer="lion", eps=1e-8),
         r"eps: not a hyperparameter of optimizer='lion' \(it takes lr, betas, weight_decay\), got 1e-08"),
        (dict(optimizer="lion", momentum=0.9),
         r"momentum: not a hyperparameter of optimizer='lion' \(it takes lr, betas, weight_decay\)"),
        (dict(optimizer="rmsprop", betas=(0.9, 0.99)),
         r"betas: not a hyperparameter of optimizer='rmsprop' "
         r"\(it takes lr, alpha, eps, weight_decay, momentum, centered\), got \(0.9, 0.99\)"),
        (dict(optimizer="rmsprop", nesterov=True), r"nesterov: not a hyperparameter of optimizer='rmsprop'"),
        (dict(alpha=0.9), r"alpha: not a hyperparameter of optimizer='adam' "
                          r"\(it takes lr, betas, eps, weight_decay\), got 0.9"),
        (dict(optimizer="sgd", centered=True), r"centered: not a hyperparameter of optimizer='sgd'"),
        # The engine's own names are not torch.optim's: Adam's pair is betas.
        (dict(beta1=0.8), r"beta1: not a hyperparameter of optimizer='adam'"),
        # A name no optimizer takes (a misspelled option) is refused the same way.
        (dict(optimizer="rmsprop", histroy=5),
         r"histroy: not a hyperparameter of optimizer='rmsprop' \(it takes lr, alpha, eps, weight_decay, "
         r"momentum, centered\), nor a keyword argument of optex.torch.OptEx, got 5"),
        (dict(optimizer="rmsprop", alpha=-1.0), r"alpha: must be finite and >= 0, got -1"),
        (dict(optimizer="rmsprop", centered=1), r"centered: must be a bool, got 1"),
        (dict(optimizer="rmsprop", momentum="high"), r"momentum: must be a real number, got 'high'"),
        (dict(optimizer="lion", betas=(1.5, 0.9)), r"betas\[0\]: must be in \[0, 1\), got 1.5"),
        (dict(optimizer="lion", betas=(0.9,)), r"betas: must be a pair \(beta1, beta2\)"),
        (dict(optimizer="lion", lr=-0.5), r"lr: must be finite and >= 0, got -0.5"),
        (dict(optimizer="Adam"), r"optimizer: must be one of"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            OptEx(params, **kwargs)
    # None means "not given", as for the named hyperparameters.
    opt = OptEx(params, optimizer="rmsprop", alpha=None, centered=None)
    assert opt.param_groups[0]["alpha"] == 0.99 and opt.param_groups[0]["centered"] is False


def test_no_hyperparameter_name_collides_with_a_keyword_of_the_facade() -> None:
    """A class whose torch.optim name equals one of OptEx's own keywords (an
    option, ``params``...) could not be passed through; none may."""
    import inspect

    own = {name for name, p in inspect.signature(OptEx.__init__).parameters.items()
           if p.kind is not inspect.Parameter.VAR_KEYWORD}
    named = {"lr", "betas", "eps", "weight_decay", "momentum", "nesterov"}
    for cls in optex.optimizer_classes():
        keys = set(torch_values(cls, cls()))
        assert not (keys & (own - named)), (cls.__name__, keys & (own - named))


def test_an_lr_scheduler_with_rmsprop_equals_set_optimizer_in_the_manual_loop() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), optimizer="rmsprop", lr=0.01, centered=True, momentum=0.5,
                parallelism=3, history=8, seed=2)
    closure = closure_for(opt, model, data)
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(6):
        opt.step(closure)
        scheduler.step()
    assert opt.param_groups[0]["lr"] == 0.01 / 8

    def rmsprop(lr):
        return optex.RmsProp(lr=lr, centered=True, momentum=0.5)

    reference = make_model()
    engine = manual_run(list(reference.parameters()), lambda: loss_of(reference, data), 6,
                        rmsprop(0.01), schedule=lambda t: rmsprop(0.01 * 0.5 ** (t // 2)),
                        parallelism=3, history=8, seed=2)
    assert bits(flat(model.parameters())) == engine.x.tobytes()
    assert opt.engine.optimizer == rmsprop(0.01 / 4)  # the last step's value

    # A change the engine's state cannot follow is refused, and changes nothing.
    before = bits(flat(model.parameters()))
    opt.param_groups[0]["centered"] = False
    with pytest.raises(ValueError, match="centered: false cannot replace true"):
        opt.step(closure)
    assert bits(flat(model.parameters())) == before and opt.engine.iteration == 6


def test_an_lr_scheduler_with_rmsprop_and_parallelism_one_follows_torch_optim() -> None:
    follow_cosine_schedule(
        lambda p: OptEx(p, optimizer="rmsprop", lr=0.01, alpha=0.9, momentum=0.9, centered=True,
                        parallelism=1),
        lambda p: torch.optim.RMSprop(p, lr=0.01, alpha=0.9, momentum=0.9, centered=True,
                                      foreach=False))


# ---------------------------------------------------------------------------- param groups


def test_param_groups_are_flattened_in_group_then_parameter_order() -> None:
    data = make_data()
    model = make_model()
    first, second = model[0], model[2]
    # Groups in the reverse of model.parameters()'s order.
    opt = OptEx([{"params": second.parameters()}, {"params": first.parameters(), "lr": 0.02}],
                lr=0.02, parallelism=3, seed=2)
    for _ in range(3):
        opt.step(closure_for(opt, model, data))
    reference = make_model()
    order = [*reference[2].parameters(), *reference[0].parameters()]
    engine = manual_run(order, lambda: loss_of(reference, data), 3, optex.Adam(lr=0.02),
                        parallelism=3, seed=2)
    assert bits(flat([*second.parameters(), *first.parameters()])) == engine.x.tobytes()


def test_a_group_with_a_bad_setting_is_refused() -> None:
    model = make_model()
    with pytest.raises(ValueError, match=r"param_groups\[1\]: lr: must be finite and >= 0"):
        OptEx([{"params": model[0].parameters()}, {"params": model[2].parameters(), "lr": -1.0}])
    opt = OptEx(model[0].parameters(), optimizer="sgd", lr=0.1)
    with pytest.raises(ValueError, match=r"param_groups\[1\]: momentum"):
        opt.add_param_group({"params": model[2].parameters(), "momentum": -0.5})
    assert len(opt.param_groups) == 1  # the refused group was not added


def test_add_param_group_before_the_first_step_is_one_engine() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model[0].parameters(), lr=0.02, parallelism=2)
    opt.add_param_group({"params": model[2].parameters()})
    closure = closure_for(opt, model, data)
    opt.step(closure)
    reference = make_model()
    engine = manual_run(list(reference.parameters()), lambda: loss_of(reference, data), 1,
                        optex.Adam(lr=0.02), parallelism=2)
    assert bits(flat(model.parameters())) == engine.x.tobytes()


# ---------------------------------------------------------------------------- checkpoints


def test_state_dict_round_trip_continues_bit_for_bit() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), optimizer="adamw", lr=0.02, parallelism=3, history=6, seed=9)
    closure = closure_for(opt, model, data)
    assert opt.state_dict()["state"] == {}  # nothing before the first step, like torch.optim
    for _ in range(3):
        opt.step(closure)
    saved = opt.state_dict()

    # torch.optim's shape, with the engine's part under "optex".
    assert set(saved) == {"state", "param_groups", "optex"}
    assert list(saved["state"]) == [0, 1, 2, 3]
    assert all(set(entry) == {"exp_avg", "exp_avg_sq", "step"} for entry in saved["state"].values())
    assert saved["optex"]["engine"]["iteration"] == 3
    assert len(saved["param_groups"]) == 1
    group = saved["param_groups"][0]
    assert group["params"] == [0, 1, 2, 3]
    assert group["lr"] == 0.02 and group["weight_decay"] == 0.01 and group["betas"] == (0.9, 0.999)
    assert not opt.state  # the state lives in the engine; state_dict() reads it out

    # Through torch.save / torch.load(weights_only=True), into a new model and optimizer.
    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "optimizer": saved}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=True)
    resumed_model = make_model(seed=5)
    resumed = OptEx(resumed_model.parameters(), optimizer="adamw", lr=0.5, parallelism=2)
    resumed_model.load_state_dict(loaded["model"])
    resumed.load_state_dict(loaded["optimizer"])
    assert resumed.param_groups[0]["lr"] == 0.02
    assert resumed.engine.iteration == 3 and resumed.parallelism == 3

    for _ in range(3):
        opt.step(closure)
        resumed.step(closure_for(resumed, resumed_model, data))
    assert bits(flat(resumed_model.parameters())) == bits(flat(model.parameters()))

    uninterrupted = make_model()
    engine = manual_run(list(uninterrupted.parameters()), lambda: loss_of(uninterrupted, data), 6,
                        optex.AdamW(lr=0.02), parallelism=3, history=6, seed=9)
    assert bits(flat(model.parameters())) == engine.x.tobytes()


def test_load_state_dict_refuses_foreign_states() -> None:
    data = make_data()
    model = make_model()
    adam = torch.optim.Adam(model.parameters())
    adam.zero_grad()
    loss_of(model, data).backward()
    adam.step()
    opt = OptEx(model.parameters())
    with pytest.raises(ValueError, match="not an optex.torch.OptEx state"):
        opt.load_state_dict(adam.state_dict())

    donor = OptEx(model.parameters(), parallelism=2)
    donor.step(closure_for(donor, model, data))
    wider = torch.nn.Sequential(torch.nn.Linear(4, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))
    other = OptEx(wider.parameters())
    with pytest.raises(ValueError, match=r"state'\]\[0\]\['exp_avg'\]: must be a torch.float32 tensor of shape \(7, 4\), got "
                       r"a tensor torch.float32 of shape \(6, 4\)"):
        other.load_state_dict(donor.state_dict())
    assert other.engine is None
    with pytest.raises(ValueError, match=r"param_groups'\]\[0\]: has no momentum, nesterov"):
        OptEx(model.parameters(), optimizer="sgd").load_state_dict(donor.state_dict())
    adamw_state = donor.state_dict()
    adamw = OptEx(model.parameters(), optimizer="adamw")
    with pytest.raises(ValueError, match="saved with optimizer='adam', this optimizer has optimizer='adamw'"):
        adamw.load_state_dict(adamw_state)
    assert adamw.engine is None
    broken = donor.state_dict()
    broken["optex"]["engine"]["x"][0] = float("inf")
    with pytest.raises(ValueError, match="x"):
        OptEx(model.parameters()).load_state_dict(broken)


def test_loading_an_empty_state_keeps_the_lazy_engine() -> None:
    data = make_data()
    model = make_model()
    fresh = OptEx(model.parameters(), lr=0.03, parallelism=2).state_dict()
    opt = OptEx(model.parameters(), lr=0.5, parallelism=2)
    opt.load_state_dict(fresh)
    assert opt.engine is None and opt.param_groups[0]["lr"] == 0.03
    opt.step(closure_for(opt, model, data))
    assert opt.engine.optimizer == optex.Adam(lr=0.03)


# ---------------------------------------------------------------------------- bad input


def test_bad_arguments_raise_value_error_naming_them() -> None:
    params = list(make_model().parameters())
    cases = [
        (dict(optimizer="lbfgs"), "optimizer: must be one of " + re.escape(
            ", ".join(repr(cls.__name__.lower()) for cls in optex.optimizer_classes())) + ", got 'lbfgs'"),
        (dict(lr=float("nan")), r"lr: must be finite and >= 0, got nan"),
        (dict(lr=-1e-3), r"lr: must be finite and >= 0, got -0.001"),
        (dict(lr="fast"), r"lr: must be a real number"),
        (dict(parallelism=0), r"parallelism: must be in \[1, 65536\], got 0"),
        (dict(history=0), r"history"),
        (dict(kernel="bogus"), r"kernel: unknown value 'bogus'"),
        (dict(momentum=0.9), r"momentum: not a hyperparameter of optimizer='adam'"),
        (dict(optimizer="sgd", betas=(0.9, 0.99)), r"betas: not a hyperparameter of optimizer='sgd'"),
        (dict(betas=(0.9, 1.5)), r"betas\[1\]: must be in \[0, 1\)"),
        (dict(betas=0.9), r"betas: must be a pair"),
        (dict(eps=-1.0), r"eps"),
        (dict(optimizer="sgd", nesterov=True), r"momentum: must be > 0 when nesterov is set"),
        (dict(optimizer="sgd", nesterov=1), r"nesterov: must be a bool"),
        (dict(options="fast"), r"options: must be an optex.Options"),
        (dict(drop_nonfinite="yes"), r"drop_nonfinite: must be a bool"),
        (dict(parallelism="many"), r"parallelism"),
        (dict(device=3), r"device: must be a str"),
    ]
    for kwargs, message in cases:
        with pytest.raises(ValueError, match=message):
            OptEx(params, **kwargs)
    import torch.distributed as dist

    if not dist.is_initialized():
        with pytest.raises(ValueError, match="distributed: True needs an initialised torch.distributed"):
            OptEx(params, distributed=True)
    if not optex.built_with_cuda():
        with pytest.raises(ValueError, match="device: cuda:0 requested"):
            OptEx(params, device="cuda:0")
    with pytest.raises(ValueError, match="floating-point"):
        OptEx([torch.zeros(3, dtype=torch.int64)])
    with pytest.raises(ValueError, match="no parameters"):
        OptEx([{"params": []}])
    with pytest.raises(ValueError, match="no elements"):
        OptEx([torch.nn.Parameter(torch.zeros(0))])
    with pytest.raises(ValueError, match="same parameter twice"), \
            pytest.warns(UserWarning, match="duplicate parameters"):  # torch's own warning
        OptEx([params[0], params[0]])


def test_step_needs_a_closure_that_returns_a_scalar_loss() -> None:
    data = make_data()
    model = make_model()
    opt = OptEx(model.parameters(), parallelism=2)
    with pytest.raises(ValueError, match="closure: optex.torch.OptEx.step needs a closure"):
        opt.step()
    with pytest.raises(ValueError, match="closure: returned None"):
        opt.step(lambda: None)

    def vector_loss():
        opt.zero_grad()
        loss = ((model(data[0]) - data[1]) ** 2).mean(dim=1)
        loss.sum().backward()
        return loss

    with pytest.raises(ValueError, match=r"closure: must return a scalar loss, got a tensor of shape \(16,\)"):
        opt.step(vector_loss)
    with pytest.raises(ValueError, match="closure: must return the loss"):
        opt.step(lambda: "loss")
    # A closure returning a float works.
    closure = closure_for(opt, model, data)
    loss = opt.step(lambda: closure().item())
    assert isinstance(loss, float)


def test_options_and_options_keywords() -> None:
    model = make_model()
    base = optex.Options(parallelism=5, history=7, kernel="rbf")
    opt = OptEx(model.parameters(), options=base, history=9, seed=3)
    opt.step(closure_for(opt, model, make_data()))
    options = opt.engine.options
    assert (options.parallelism, options.history, options.kernel, options.seed) == (5, 9, "rbf", 3)
    assert options.device == "cpu"
    assert base.history == 7  # the caller's object is not changed
    assert opt.parallelism == 5


def test_documentation() -> None:
    assert "closure" in OptEx.__doc__ and "param groups" in OptEx.__doc__.lower()
    for name in ("step", "state_dict", "load_state_dict", "add_param_group", "engine", "last_info",
                 "current_point", "current_seed", "parallelism"):
        doc = getattr(OptEx, name).__doc__
        assert doc and doc.strip(), name
    assert optex.torch.__doc__ and "closure" in optex.torch.__doc__
    assert isinstance(OptEx(make_model().parameters()), torch.optim.Optimizer)


# ---------------------------------------------------------------------------- torch.distributed

DISTRIBUTED_N = 3  # uneven over 2 ranks: rank 0 evaluates points 0 and 1, rank 1 point 2
DISTRIBUTED_STEPS = 4


def _distributed_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One rank of the distributed test (spawned by torch.multiprocessing)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        data = make_data()
        # Rank 1 starts elsewhere: every rank must adopt rank 0's start point.
        model = make_model(seed=0 if rank == 0 else 11)
        opt = OptEx(model.parameters(), lr=0.03, parallelism=DISTRIBUTED_N, seed=5)
        evaluated: list[list[int]] = []
        record = []
        closure = closure_for(opt, model, data, record)
        losses = []
        failure = ""
        for step in range(DISTRIBUTED_STEPS):
            if step == 2:
                failure = step_failing_on_rank_1(opt, closure, rank)
            record.clear()
            loss = opt.step(closure)
            evaluated.append([r[0] for r in record])
            losses.append(loss.item())
        torch.save({"x": flat(model.parameters()), "losses": losses, "evaluated": evaluated,
                    "failure": failure, "state": opt.state_dict()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
        # No rank tears gloo down while the other is still in a collective: gloo aborts
        # the process when a peer disconnects mid-operation.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_torch_distributed_equals_the_single_process_run(tmp_path: Path, monkeypatch) -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch has no torch.distributed with the gloo backend")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_distributed_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2,
             join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    with one_thread():
        data = make_data()
        model = make_model(seed=0)
        opt = OptEx(model.parameters(), lr=0.03, parallelism=DISTRIBUTED_N, seed=5)
        closure = closure_for(opt, model, data)
        losses = [opt.step(closure).item() for _ in range(DISTRIBUTED_STEPS)]
        single = flat(model.parameters())

    for r, result in enumerate(ranks):
        assert bits(result["x"]) == bits(single), f"rank {r}"
        assert result["losses"] == losses, f"rank {r}"
        assert bits(result["state"]["optex"]["engine"]["x"]) == bits(ranks[0]["state"]["optex"]["engine"]["x"])
        assert bits(result["state"]["state"][0]["exp_avg"]) == bits(ranks[0]["state"]["state"][0]["exp_avg"])
        assert "the closure raised on rank 1 at point 2" in result["failure"], result["failure"]
    assert "rank 1 lost its data" in ranks[1]["failure"]
    assert all(points == [0, 1] for points in ranks[0]["evaluated"])
    assert all(points == [2] for points in ranks[1]["evaluated"])


# ---------------------------------------------------------------------------- CUDA


def _cuda_run(device_option: str | None):
    data = make_data(device="cuda")
    model = make_model(device="cuda")
    opt = OptEx(model.parameters(), lr=0.02, parallelism=3, device=device_option)
    closure = closure_for(opt, model, data)
    for _ in range(3):
        loss = opt.step(closure)
    assert loss.device.type == "cuda"
    assert all(p.device.type == "cuda" for p in model.parameters())
    reference = make_model(device="cuda")
    engine = manual_run(list(reference.parameters()), lambda: loss_of(reference, data), 3,
                        optex.Adam(lr=0.02), parallelism=3, device=opt.engine.options.device)
    assert bits(flat(model.parameters())) == engine.x.tobytes()
    return opt


@pytest.mark.gpu
def test_cuda_parameters_run_the_engine_on_their_gpu() -> None:
    require_torch_cuda(optex_build=True)
    opt = _cuda_run(None)
    assert opt.engine.options.device == f"cuda:{torch.cuda.current_device()}"
    # The engine's iterate is in GPU memory, wrapped without a copy.
    x = torch.from_dlpack(opt.engine.device_x())
    assert x.device.type == "cuda" and x.data_ptr() != 0
    assert bits(x) == opt.engine.x.tobytes()


@pytest.mark.gpu
def test_cuda_parameters_with_a_host_engine() -> None:
    require_torch_cuda(optex_build=False)
    opt = _cuda_run("cpu")
    assert opt.engine.options.device == "cpu"


def test_the_readme_pytorch_example_runs(tmp_path: Path, monkeypatch) -> None:
    import re

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = text[text.index("## PyTorch") :]
    section = section[: section.index("\n## ", 1)]
    code = re.search(r"^```python\n(.*?)^```", section, flags=re.MULTILINE | re.DOTALL).group(1)
    script = tmp_path / "pytorch_example.py"
    script.write_text(code, encoding="utf-8")
    monkeypatch.chdir(tmp_path)  # where the example saves its state
    runpy.run_path(str(script), run_name="__main__")
    assert (tmp_path / "opt.pt").exists()
