"""With N = 1 the engine is its base optimizer: how closely it follows PyTorch.

Every case runs 100 steps of the same float32 model from the same start with
the same deterministic objective (a small tanh MLP on fixed data, six tensors
of four shapes, d = 109), three ways:

- the reference: ``torch.optim.Adam``, ``AdamW``, ``SGD``, ``RMSprop``; for Lion,
  which torch does not ship, the update of the ``lion-pytorch`` package written
  out below in torch ops;
- ``optex.OptEx(x0, optimizer=..., parallelism=1)`` ask/tell, the gradient taken
  by torch autograd at the engine's point;
- ``optex.torch.OptEx(params, optimizer=<name>, ..., parallelism=1)`` driving the
  same parameters through its closure.

After every step, max |x - x_torch| / max |x_torch| must be <= 1e-6. The
measure is relative to the scale of the whole parameter vector, not per
coordinate: a coordinate that passes near zero makes its own relative error
meaningless, while the vector's largest magnitude is what a float32 rounding
error is proportional to. 1e-6 is about 8 float32 ulps (2^-23 = 1.2e-7) of the
largest coordinate: room for a different rounding in a few operations, far
below any difference of formula (a wrong bias correction or a coupled instead
of a decoupled decay moves the iterate by 1e-3 or more within a few steps).

Run with ``-s`` to print a table of the measured agreement: the largest
relative deviation over the 100 steps, the fraction of coordinates that are
bit-identical to torch's (at the last step and over all steps), the first step
with a differing bit, how far the reference moved, and how far the reference
itself ends from a start one ulp away in one coordinate.

How far bit-equality goes: from the first step on, only part of the
coordinates are bit-identical, because torch's CPU kernels for ``add(...,
alpha=)``, ``lerp`` and ``addcmul`` use fused multiply-adds where the CPU has
them (x86-64 with FMA; ``addcdiv`` and ``mul`` do not), while the engine rounds
every product and sum separately (it is built with -ffp-contract=off, and its
CUDA kernels with --fmad=false, so that the two backends agree bit for bit).
The rest is the same formula, which keeps the deviation at a few ulps. Lion is
bit-identical: its parameter moves by exactly lr times a sign.

Some settings amplify any rounding difference, whoever makes it: with RMSprop
at alpha = 0.9 and lr = 0.01 on this model, torch against torch from a start
one ulp away in one coordinate deviates by 1e-2 within 100 steps. The cases
below stay away from such edges of stability (the table's last column shows
each reference's own sensitivity).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="these tests compare optex with torch.optim and need PyTorch (pip install torch)"
)

import optex  # noqa: E402
import optex.torch  # noqa: E402

STEPS = 100
TOLERANCE = 1e-6

# ---------------------------------------------------------------------------- the objective

# The model's tensors by name, and their shapes: a 5-8-6-1 tanh MLP.
SHAPES = {"w1": (8, 5), "b1": (8,), "w2": (6, 8), "b2": (6,), "w3": (1, 6), "b3": (1,)}
# The order of the tensors in the flat vector: the model's own, and for the
# per-range cases weights first, then biases (the ranges are contiguous).
MODEL_ORDER = ("w1", "b1", "w2", "b2", "w3", "b3")
WEIGHTS, BIASES = ("w1", "w2", "w3"), ("b1", "b2", "b3")
BY_KIND = WEIGHTS + BIASES


def _start() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(2024)
    return {name: (torch.randn(shape, generator=g) * 0.7).float() for name, shape in SHAPES.items()}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    inputs = torch.randn(32, 5, generator=g)
    targets = torch.sin(2.0 * inputs[:, :1]) * torch.cos(inputs[:, 1:2]) + 0.1 * torch.randn(32, 1, generator=g)
    return inputs.float(), targets.float()


START = _start()
DATA = _data()


def loss_of(p: dict[str, torch.Tensor]) -> torch.Tensor:
    """A non-quadratic, deterministic float32 loss of the tensors by name."""
    inputs, targets = DATA
    h = torch.tanh(inputs @ p["w1"].T + p["b1"])
    h = torch.tanh(h @ p["w2"].T + p["b2"])
    out = h @ p["w3"].T + p["b3"]
    return ((out - targets) ** 2).mean()


def flat(p: dict[str, torch.Tensor], order: Sequence[str]) -> torch.Tensor:
    return torch.cat([p[name].detach().reshape(-1) for name in order]).clone()


def sizes(names: Sequence[str]) -> int:
    return sum(int(np.prod(SHAPES[name])) for name in names)


def leaves(x: torch.Tensor, order: Sequence[str]) -> dict[str, torch.Tensor]:
    """The flat vector as fresh tensors by name, each requiring its gradient."""
    pieces = x.split([sizes([name]) for name in order])
    return {name: piece.reshape(SHAPES[name]).clone().requires_grad_(True)
            for name, piece in zip(order, pieces)}


def nudged(start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The start with one coordinate moved by one float32 ulp: a reference run from
    there shows how far one rounding difference alone carries in 100 steps."""
    out = {name: t.clone() for name, t in start.items()}
    w = out["w2"].view(-1)
    w[3] = torch.nextafter(w[3], torch.tensor(float("inf")))
    return out


def copy_of(start: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone().requires_grad_(True) for name, t in start.items()}


# ---------------------------------------------------------------------------- the three drivers

Trajectory = list  # the flat iterate after each step, float32 tensors


def torch_trajectory(make: Callable[[dict[str, torch.Tensor]], Any], order: Sequence[str] = MODEL_ORDER,
                     before_step: Callable[[Any, int], None] | None = None,
                     start: dict[str, torch.Tensor] = START) -> Trajectory:
    """`make(params by name)` returns an optimizer with a step() (torch.optim's or
    the Lion reference); `before_step(optimizer, t)` runs before each step."""
    p = copy_of(start)
    opt = make(p)
    out = []
    for t in range(STEPS):
        if before_step is not None:
            before_step(opt, t)
        opt.zero_grad()
        loss_of(p).backward()
        opt.step()
        out.append(flat(p, order))
    return out


def engine_trajectory(optimizer: Any, order: Sequence[str] = MODEL_ORDER,
                      schedule: Callable[[int], Any] | None = None) -> Trajectory:
    """optex.OptEx ask/tell with N = 1; `schedule(t)`, when given, is the optimizer
    (or ranges) of step t, set with set_optimizer."""
    engine = optex.OptEx(flat(START, order).numpy(), optimizer=optimizer, parallelism=1)
    out = []
    for t in range(STEPS):
        if schedule is not None:
            engine.set_optimizer(schedule(t))
        point = torch.from_numpy(np.array(engine.ask()[0]))
        p = leaves(point, order)
        loss = loss_of(p)
        grads = torch.autograd.grad(loss, [p[name] for name in order])
        grad = torch.cat([g.reshape(-1) for g in grads])
        engine.tell(grad.numpy()[None, :], np.array([loss.item()]))
        out.append(torch.from_numpy(engine.x.copy()))
    return out


def facade_trajectory(name: str, hyper: dict[str, Any]) -> Trajectory:
    """optex.torch.OptEx with N = 1 driving the tensors through its closure."""
    p = copy_of(START)
    opt = optex.torch.OptEx([p[n] for n in MODEL_ORDER], optimizer=name, parallelism=1, **hyper)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_of(p)
        loss.backward()
        return loss

    out = []
    for _ in range(STEPS):
        opt.step(closure)
        out.append(flat(p, MODEL_ORDER))
    return out


class LionReference:
    """Lion (Chen et al. 2023) as the ``lion-pytorch`` package writes its update,
    op for op; torch.optim has no Lion."""

    def __init__(self, params: Sequence[torch.Tensor], lr: float, betas: tuple[float, float],
                 weight_decay: float) -> None:
        self.params = list(params)
        self.lr, self.betas, self.weight_decay = lr, betas, weight_decay
        self.exp_avg = [torch.zeros_like(p) for p in self.params]

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self) -> None:
        lr, wd, (beta1, beta2) = self.lr, self.weight_decay, self.betas
        for p, exp_avg in zip(self.params, self.exp_avg):
            grad = p.grad
            p.data.mul_(1 - lr * wd)
            update = exp_avg.clone().mul_(beta1).add(grad, alpha=1 - beta1).sign_()
            p.add_(update, alpha=-lr)
            exp_avg.mul_(beta2).add_(grad, alpha=1 - beta2)


# ---------------------------------------------------------------------------- measuring

@dataclass
class Agreement:
    label: str
    max_relative: float  # max over steps of max |x - x_torch| / max |x_torch|
    identical_last: float  # fraction of coordinates bit-identical at the last step
    identical_all: float  # ... over all steps and coordinates
    first_difference: int | None  # the first step (1-based) with a differing bit
    moved: float  # max |x_T - x_0| / max |x_0| of the reference: how far it went
    # The reference against itself from a start one ulp away in one coordinate
    # (max relative deviation over the steps): what one rounding difference does.
    sensitivity: float | None


REPORT: list[Agreement] = []


@pytest.fixture(scope="module", autouse=True)
def _print_report():
    """Prints the measured agreement after the module's tests (shown with -s)."""
    yield
    if not REPORT:
        return
    width = max(len(a.label) for a in REPORT)
    lines = [f"\nN = 1 against PyTorch, {STEPS} steps, d = {sizes(MODEL_ORDER)}, float32",
             f"{'case':<{width}}  max rel. dev.  bit-identical: last step / all steps  "
             "first differing step  reference moved  reference from 1 ulp away"]
    for a in REPORT:
        first = "-" if a.first_difference is None else str(a.first_difference)
        sensitivity = "" if a.sensitivity is None else f"{a.sensitivity:.3e}"
        lines.append(f"{a.label:<{width}}  {a.max_relative:13.3e}  {a.identical_last:24.1%} / "
                     f"{a.identical_all:6.1%}  {first:>20}  {a.moved:15.3f}  {sensitivity:>25}")
    print("\n".join(lines))


def max_relative(ours: Trajectory, reference: Trajectory) -> float:
    return max(float((x - ref).abs().max() / ref.abs().max()) for x, ref in zip(ours, reference))


def agreement(label: str, ours: Trajectory, reference: Trajectory, start: torch.Tensor,
              sensitivity: float | None = None) -> Agreement:
    """Compares the trajectories step by step, records the numbers and asserts the
    tolerance after every step (the message names the first step that breaks it)."""
    assert len(ours) == len(reference) == STEPS
    deviations, identical, first_difference = [], [], None
    for t, (x, ref) in enumerate(zip(ours, reference), start=1):
        deviations.append(float((x - ref).abs().max() / ref.abs().max()))
        same = x.view(torch.int32) == ref.view(torch.int32)
        identical.append(same)
        if first_difference is None and not bool(same.all()):
            first_difference = t
    result = Agreement(
        label=label,
        max_relative=max(deviations),
        identical_last=float(identical[-1].float().mean()),
        identical_all=float(torch.stack(identical).float().mean()),
        first_difference=first_difference,
        moved=float((reference[-1] - start).abs().max() / start.abs().max()),
        sensitivity=sensitivity,
    )
    REPORT.append(result)
    summary = (f"{label}: max relative deviation {result.max_relative:.3e} over {STEPS} steps, "
               f"{result.identical_last:.1%} of the coordinates bit-identical at the last step, "
               f"{result.identical_all:.1%} over all steps")
    for t, deviation in enumerate(deviations, start=1):
        assert deviation <= TOLERANCE, f"step {t}: relative deviation {deviation:.3e} > {TOLERANCE}; {summary}"
    # The learning rates are meant to move the parameters, not to make agreement trivial.
    assert result.moved > 0.05, summary
    return result


# ---------------------------------------------------------------------------- one optimizer per run

def by_name(p: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    return [p[name] for name in MODEL_ORDER]


@dataclass
class Case:
    id: str
    engine: Any  # the optex optimizer
    facade: tuple[str, dict[str, Any]]  # optex.torch.OptEx's optimizer= and hyperparameters
    reference: Callable[..., Any]  # (params, **foreach) -> the reference optimizer


TORCH_CASES = [
    Case("adam", optex.Adam(lr=0.02), ("adam", {"lr": 0.02}),
         lambda ps, **kw: torch.optim.Adam(ps, lr=0.02, **kw)),
    Case("adam, betas, eps, weight decay",
         optex.Adam(lr=0.02, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=0.05),
         ("adam", {"lr": 0.02, "betas": (0.8, 0.99), "eps": 1e-6, "weight_decay": 0.05}),
         lambda ps, **kw: torch.optim.Adam(ps, lr=0.02, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05, **kw)),
    Case("adamw", optex.AdamW(lr=0.02, weight_decay=0.1), ("adamw", {"lr": 0.02, "weight_decay": 0.1}),
         lambda ps, **kw: torch.optim.AdamW(ps, lr=0.02, weight_decay=0.1, **kw)),
    Case("sgd", optex.Sgd(lr=0.2), ("sgd", {"lr": 0.2}),
         lambda ps, **kw: torch.optim.SGD(ps, lr=0.2, **kw)),
    Case("sgd, momentum", optex.Sgd(lr=0.03, momentum=0.9), ("sgd", {"lr": 0.03, "momentum": 0.9}),
         lambda ps, **kw: torch.optim.SGD(ps, lr=0.03, momentum=0.9, **kw)),
    Case("sgd, nesterov", optex.Sgd(lr=0.05, momentum=0.9, nesterov=True),
         ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
         lambda ps, **kw: torch.optim.SGD(ps, lr=0.05, momentum=0.9, nesterov=True, **kw)),
    Case("sgd, weight decay", optex.Sgd(lr=0.2, weight_decay=0.05), ("sgd", {"lr": 0.2, "weight_decay": 0.05}),
         lambda ps, **kw: torch.optim.SGD(ps, lr=0.2, weight_decay=0.05, **kw)),
    Case("sgd, momentum, weight decay", optex.Sgd(lr=0.05, momentum=0.5, weight_decay=0.01),
         ("sgd", {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.01}),
         lambda ps, **kw: torch.optim.SGD(ps, lr=0.05, momentum=0.5, weight_decay=0.01, **kw)),
    Case("rmsprop", optex.RmsProp(lr=0.01), ("rmsprop", {"lr": 0.01}),
         lambda ps, **kw: torch.optim.RMSprop(ps, lr=0.01, **kw)),
    Case("rmsprop, momentum", optex.RmsProp(lr=0.003, momentum=0.9), ("rmsprop", {"lr": 0.003, "momentum": 0.9}),
         lambda ps, **kw: torch.optim.RMSprop(ps, lr=0.003, momentum=0.9, **kw)),
    Case("rmsprop, centered", optex.RmsProp(lr=0.01, centered=True), ("rmsprop", {"lr": 0.01, "centered": True}),
         lambda ps, **kw: torch.optim.RMSprop(ps, lr=0.01, centered=True, **kw)),
    Case("rmsprop, centered, momentum", optex.RmsProp(lr=0.003, centered=True, momentum=0.9),
         ("rmsprop", {"lr": 0.003, "centered": True, "momentum": 0.9}),
         lambda ps, **kw: torch.optim.RMSprop(ps, lr=0.003, centered=True, momentum=0.9, **kw)),
    Case("rmsprop, alpha, weight decay", optex.RmsProp(lr=0.005, alpha=0.9, weight_decay=0.05),
         ("rmsprop", {"lr": 0.005, "alpha": 0.9, "weight_decay": 0.05}),
         lambda ps, **kw: torch.optim.RMSprop(ps, lr=0.005, alpha=0.9, weight_decay=0.05, **kw)),
]

LION_CASES = [
    Case("lion", optex.Lion(lr=0.003), ("lion", {"lr": 0.003}),
         lambda ps: LionReference(ps, lr=0.003, betas=(0.9, 0.99), weight_decay=0.0)),
    Case("lion, betas, weight decay", optex.Lion(lr=0.003, beta1=0.95, beta2=0.98, weight_decay=0.1),
         ("lion", {"lr": 0.003, "betas": (0.95, 0.98), "weight_decay": 0.1}),
         lambda ps: LionReference(ps, lr=0.003, betas=(0.95, 0.98), weight_decay=0.1)),
]


@pytest.mark.parametrize("case", TORCH_CASES, ids=lambda c: c.id)
def test_parallelism_one_follows_torch_optim(case: Case) -> None:
    start = flat(START, MODEL_ORDER)
    # foreach=False: the single-tensor implementation is the reference formula the
    # engine follows (torch's multi-tensor path groups the same operations
    # differently). On CPU the default (foreach=None) picks the single-tensor path
    # too, which the second reference shows.
    single = torch_trajectory(lambda p: case.reference(by_name(p), foreach=False))
    default = torch_trajectory(lambda p: case.reference(by_name(p)))
    sensitivity = max_relative(
        torch_trajectory(lambda p: case.reference(by_name(p), foreach=False), start=nudged(START)), single)
    engine = engine_trajectory(case.engine)
    facade = facade_trajectory(*case.facade)
    agreement(f"{case.id}: optex.OptEx vs foreach=False", engine, single, start, sensitivity)
    agreement(f"{case.id}: optex.OptEx vs the default", engine, default, start)
    agreement(f"{case.id}: optex.torch.OptEx vs foreach=False", facade, single, start)


@pytest.mark.parametrize("case", LION_CASES, ids=lambda c: c.id)
def test_parallelism_one_follows_the_lion_reference(case: Case) -> None:
    start = flat(START, MODEL_ORDER)
    reference = torch_trajectory(lambda p: case.reference(by_name(p)))
    sensitivity = max_relative(torch_trajectory(lambda p: case.reference(by_name(p)), start=nudged(START)),
                               reference)
    agreement(f"{case.id}: optex.OptEx vs lion-pytorch's update", engine_trajectory(case.engine),
              reference, start, sensitivity)
    agreement(f"{case.id}: optex.torch.OptEx vs lion-pytorch's update", facade_trajectory(*case.facade),
              reference, start)


# ---------------------------------------------------------------------------- per-range hyperparameters

N_WEIGHTS, N_BIASES = sizes(WEIGHTS), sizes(BIASES)


def groups(p: dict[str, torch.Tensor], weights: dict[str, Any], biases: dict[str, Any]) -> list[dict[str, Any]]:
    """torch.optim param groups: the weights, then the biases (the engine's two ranges)."""
    return [{"params": [p[n] for n in WEIGHTS], **weights}, {"params": [p[n] for n in BIASES], **biases}]


RANGE_CASES = [
    ("adamw, lr and weight decay per group",
     [(N_WEIGHTS, optex.AdamW(lr=0.02, weight_decay=0.1)), (N_BIASES, optex.AdamW(lr=0.005, weight_decay=0.0))],
     lambda p: torch.optim.AdamW(groups(p, {"lr": 0.02, "weight_decay": 0.1}, {"lr": 0.005, "weight_decay": 0.0}),
                                 foreach=False)),
    ("sgd, momentum 0.9 and 0 per group",
     [(N_WEIGHTS, optex.Sgd(lr=0.05, momentum=0.9)), (N_BIASES, optex.Sgd(lr=0.2, momentum=0.0))],
     lambda p: torch.optim.SGD(groups(p, {"lr": 0.05, "momentum": 0.9}, {"lr": 0.2, "momentum": 0.0}),
                               foreach=False)),
    ("rmsprop, alpha per group",
     [(N_WEIGHTS, optex.RmsProp(lr=0.003, alpha=0.9)), (N_BIASES, optex.RmsProp(lr=0.003, alpha=0.99))],
     lambda p: torch.optim.RMSprop(groups(p, {"alpha": 0.9}, {"alpha": 0.99}), lr=0.003, foreach=False)),
]


@pytest.mark.parametrize(("label", "ranges", "make_torch"), RANGE_CASES, ids=[c[0] for c in RANGE_CASES])
def test_ranges_follow_torch_param_groups(label: str, ranges, make_torch) -> None:
    start = flat(START, BY_KIND)
    reference = torch_trajectory(make_torch, order=BY_KIND)
    sensitivity = max_relative(torch_trajectory(make_torch, order=BY_KIND, start=nudged(START)), reference)
    agreement(f"{label}: optex.OptEx ranges vs param groups", engine_trajectory(ranges, order=BY_KIND),
              reference, start, sensitivity)


def test_a_schedule_per_group_follows_lambda_lr_with_set_optimizer() -> None:
    """torch's LambdaLR with a different lambda per group, mirrored by giving the
    engine each step's learning rates with set_optimizer."""
    base = (0.02, 0.01)
    lambdas = (lambda t: 0.97 ** t, lambda t: 1.0 / (1.0 + 0.05 * t))
    scheduled: list[tuple[float, float]] = []  # the lr of each group at each step, as torch had it

    def make(p):
        opt = torch.optim.AdamW(groups(p, {"lr": base[0], "weight_decay": 0.1},
                                       {"lr": base[1], "weight_decay": 0.0}), foreach=False)
        opt.scheduler = torch.optim.lr_scheduler.LambdaLR(opt, list(lambdas))
        return opt

    def before_step(opt, t):
        if t > 0:
            opt.scheduler.step()
        scheduled.append(tuple(g["lr"] for g in opt.param_groups))

    reference = torch_trajectory(make, order=BY_KIND, before_step=before_step)
    assert scheduled[10] == (base[0] * lambdas[0](10), base[1] * lambdas[1](10))

    def ranges(t):
        return [(N_WEIGHTS, optex.AdamW(lr=scheduled[t][0], weight_decay=0.1)),
                (N_BIASES, optex.AdamW(lr=scheduled[t][1], weight_decay=0.0))]

    agreement("adamw, LambdaLR per group: optex.OptEx set_optimizer vs param groups",
              engine_trajectory(ranges(0), order=BY_KIND, schedule=ranges), reference, flat(START, BY_KIND))
