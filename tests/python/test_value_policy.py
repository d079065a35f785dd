"""One rule for what a loss and a gradient may be (python/optex/_values.py), at every
entry point: optex.minimize's objective, OptEx.tell, OptEx.observe, optex.plan's
objective, and the array arguments' lists. A loss is a real number (one-element
arrays included, as scipy takes them); a gradient a float32/float64 array or a
list of real numbers. Each refusal names the value and changes nothing; each
accepted kind gives the plain float's result bit for bit."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from objectives import returns_string_loss, rosenbrock

import optex
from optex import problems

torch = pytest.importorskip("torch")

D = 6
X0 = problems.Rosenbrock().standard_start(D)
CONFIG = dict(optimizer=optex.Adam(lr=0.01), parallelism=3)

# ---- the kinds ---------------------------------------------------------------------------

# (the loss as returned, how the refusal names it)
REFUSED_LOSSES = [
    ("abc", r"got 'abc' \(str\)"),
    ("1.5", r"got '1.5' \(str\)"),
    (b"1", r"got b'1' \(bytes\)"),
    (True, r"got True \(bool\)"),
    (np.bool_(False), r"got np.False_ \(bool\)|got False \(bool_\)"),
    (1 + 0j, r"got \(1\+0j\) \(complex\)"),
    (np.complex128(1.0), r"\(complex128\)"),
    (None, r"got None \(NoneType\)"),
    ([1.0], r"got \[1.0\] \(list\)"),
    ((1.0,), r"\(tuple\)"),
    (np.array([1.0, 2.0]), r"an array of shape \(2,\) and dtype float64"),
    (np.zeros((0,)), r"an array of shape \(0,\)"),
    (np.array(["1.0"]), r"dtype <U3"),
    (np.array([True]), r"dtype bool"),
    (np.array([1 + 0j]), r"dtype complex128"),
    (np.array([1.0], dtype=object), r"dtype object"),
    (10**400, r"within the float64 range"),
    (object(), r"\(object\)"),
    (torch.tensor([1.0, 2.0]), r"a tensor of shape \(2,\)"),
    (torch.tensor(True), r"a tensor of dtype torch.bool"),
    (torch.tensor(1 + 1j), r"a tensor of dtype torch.complex64"),
]

REFUSED_GRADIENTS = [
    (lambda g: [str(v) for v in g], r"must hold real numbers, got '[-0-9.e]+' \(str\) at index \(0,\)"),
    (lambda g: [True] * D, r"must hold real numbers, got True \(bool\) at index \(0,\)"),
    (lambda g: [*g[:-1].tolist(), True], rf"got True \(bool\) at index \({D - 1},\)"),
    (lambda g: [*g[:2].tolist(), np.bool_(True), *g[3:].tolist()], r"at index \(2,\)"),
    (lambda g: [complex(v) for v in g], r"\(complex\) at index \(0,\)"),
    (lambda g: [None] * D, r"got None \(NoneType\) at index \(0,\)"),
    (lambda g: [b"1"] * D, r"\(bytes\) at index \(0,\)"),
    (lambda g: "1.0", r"must be an array of real numbers, got '1.0' \(str\)"),
    (lambda g: None, r"must be an array of real numbers, got None"),
    (lambda g: g.astype(str), r"dtype <U\d+ is not supported"),
    (lambda g: g.astype(bool), r"dtype bool is not supported"),
    (lambda g: g.astype(complex), r"dtype complex128 is not supported"),
    (lambda g: g.astype(object), r"dtype object is not supported"),
    (lambda g: g.astype(np.int64), r"dtype int64 is not supported"),
    (lambda g: g.astype(np.float16), r"dtype float16 is not supported"),
    (lambda g: g[:-1], rf"has shape \({D - 1},\), expected \({D},\)"),
    (lambda g: [g.tolist()], rf"has shape \(1, {D}\), expected \({D},\)"),
]

# Accepted losses, each with the float it stands for.
ACCEPTED_LOSSES = [
    lambda v: np.float64(v),
    lambda v: np.array(v),
    lambda v: np.array([v]),
    lambda v: np.array([[v]]),
    lambda v: torch.tensor(v, dtype=torch.float64),
    lambda v: torch.tensor([v], dtype=torch.float64, requires_grad=True),
]

ACCEPTED_GRADIENTS = [
    lambda g: g.tolist(),
    lambda g: tuple(g.tolist()),
    lambda g: [np.float64(v) for v in g],
    lambda g: g.astype(np.float64),
]


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def returning(loss_kind=None, grad_kind=None):
    """rosenbrock with its loss and gradient returned as the given kinds (float32 gradient)."""
    def objective(x: np.ndarray):
        loss, grad = rosenbrock(x)
        grad = np.asarray(grad, dtype=np.float32)
        return (float(loss) if loss_kind is None else loss_kind(float(loss)),
                grad if grad_kind is None else grad_kind(grad))
    return objective


# ---- optex.minimize -----------------------------------------------------------------------


@pytest.mark.parametrize("loss, shown", REFUSED_LOSSES,
                         ids=[f"loss{i}" for i in range(len(REFUSED_LOSSES))])
def test_minimize_refuses_a_loss_that_is_not_a_real_number(loss, shown: str) -> None:
    engine = optex.OptEx(X0, **CONFIG)
    x_before = engine.x

    def objective(x: np.ndarray):
        return loss, rosenbrock(x)[1]

    with pytest.raises(ValueError, match="^fun_and_grad: the loss at point 0 must be a real number"
                       ) as refused:
        optex.minimize(objective, engine, max_iters=3)
    assert re.search(shown, str(refused.value)), str(refused.value)
    assert engine.pending and engine.iteration == 0 and engine.evaluations == 0
    assert same_bits(engine.x, x_before)


def test_minimize_names_the_point_whose_loss_is_refused() -> None:
    calls = []

    def objective(x: np.ndarray):
        calls.append(None)
        loss, grad = rosenbrock(x)
        return ("abc" if len(calls) == 3 else loss), grad

    with pytest.raises(ValueError, match=r"^fun_and_grad: the loss at point \d must be a real "
                       r"number, got 'abc' \(str\)$"):
        optex.minimize(objective, X0, max_iters=3, max_workers=1, **CONFIG)


@pytest.mark.parametrize("make, message", REFUSED_GRADIENTS,
                         ids=[f"grad{i}" for i in range(len(REFUSED_GRADIENTS))])
def test_minimize_refuses_a_gradient_that_is_not_real_numbers(make, message: str) -> None:
    engine = optex.OptEx(X0, **CONFIG)
    with pytest.raises(ValueError, match="^fun_and_grad: the gradient at point 0.*" + message):
        optex.minimize(returning(grad_kind=make), engine, max_iters=3)
    assert engine.pending and engine.iteration == 0 and engine.evaluations == 0


def test_minimize_refuses_a_bad_loss_at_the_final_evaluation_too() -> None:
    rounds = []

    def objective(x: np.ndarray):
        loss, grad = rosenbrock(x)
        return (b"done" if len(rounds) == 2 else loss), grad

    with pytest.raises(ValueError, match=r"^fun_and_grad: the loss at x must be a real number"):
        optex.minimize(objective, X0, max_iters=2, callback=lambda info: rounds.append(info),
                       **CONFIG)


@pytest.mark.parametrize("kind", range(len(ACCEPTED_LOSSES)))
def test_minimize_takes_every_real_loss_as_its_float(kind: int) -> None:
    plain = optex.minimize(returning(), X0, max_iters=6, **CONFIG)
    other = optex.minimize(returning(loss_kind=ACCEPTED_LOSSES[kind]), X0, max_iters=6, **CONFIG)
    assert same_bits(other.x, plain.x) and other.loss_history == plain.loss_history
    assert type(other.fun) is float and other.fun == plain.fun


@pytest.mark.parametrize("kind", range(len(ACCEPTED_GRADIENTS)))
def test_minimize_takes_every_real_gradient_as_the_float32_array(kind: int) -> None:
    plain = optex.minimize(returning(), X0, max_iters=6, **CONFIG)
    other = optex.minimize(returning(grad_kind=ACCEPTED_GRADIENTS[kind]), X0, max_iters=6,
                           **CONFIG)
    assert same_bits(other.x, plain.x) and other.loss_history == plain.loss_history


def test_minimize_refuses_on_processes_with_the_same_words() -> None:
    with pytest.raises(ValueError, match=r"^fun_and_grad: the loss at point 0 must be a real "
                       r"number, got 'abc' \(str\)$"):
        optex.minimize(returns_string_loss, X0, max_iters=2, workers="processes", max_workers=1,
                       **CONFIG)


# ---- OptEx.tell ---------------------------------------------------------------------------


def asked(engine: optex.OptEx) -> tuple[np.ndarray, np.ndarray]:
    """The round's true gradients (float64) and losses."""
    points = np.array(engine.ask())
    pairs = [rosenbrock(p) for p in points]
    return (np.array([g for _, g in pairs], dtype=np.float64),
            np.array([loss for loss, _ in pairs], dtype=np.float64))


def snapshot(engine: optex.OptEx) -> tuple:
    return (engine.x.tobytes(), engine.iteration, engine.evaluations, engine.pending,
            np.array(engine.ask()).tobytes())


@pytest.mark.parametrize(
    "grads, losses, message",
    [
        (lambda g: [[str(v) for v in row] for row in g], None,
         r"^grads: must hold real numbers, got '[-0-9.e]+' \(str\) at index \(0, 0\)$"),
        (lambda g: [row.tolist()[:-1] + [True] for row in g], None,
         rf"^grads: must hold real numbers, got True \(bool\) at index \(0, {D - 1}\)$"),
        (lambda g: [g[0], g[1], [complex(v) for v in g[2]]], None,
         r"^grads: must hold real numbers, got \(?[-0-9.e+j]+\)? \(complex\) at index \(2, 0\)$"),
        (lambda g: [g[0], None, g[2]], None, r"^grads: must hold real numbers, got None"),
        (lambda g: [g[0], g[1], g[2].astype(bool)], None,
         r"^grads: must hold real numbers, got an array of shape \(6,\) and dtype bool"),
        (None, lambda l: [str(v) for v in l], r"^losses: must hold real numbers, got '.*' \(str\)"),
        (None, lambda l: [l[0], True, l[2]], r"^losses: must hold real numbers, got True \(bool\) "
                                             r"at index \(1,\)$"),
        (None, lambda l: [l[0], l[1], None], r"^losses: must hold real numbers, got None"),
        (None, lambda l: [l[0], l[1], 1j], r"^losses: .* \(complex\) at index \(2,\)$"),
        (None, lambda l: l.astype(complex), r"^losses: dtype complex128 is not supported"),
    ],
)
@pytest.mark.parametrize("drop_nonfinite", [False, True])
def test_tell_refuses_lists_of_what_is_not_a_real_number(grads, losses, message: str,
                                                         drop_nonfinite: bool) -> None:
    engine = optex.OptEx(X0, **CONFIG)
    g, l = asked(engine)
    before = snapshot(engine)
    with pytest.raises(ValueError, match=message):
        engine.tell(g if grads is None else grads(g), l if losses is None else losses(l),
                    drop_nonfinite=drop_nonfinite)
    assert snapshot(engine) == before
    # The same round, told properly, is the twin's bit for bit.
    twin = optex.OptEx(X0, **CONFIG)
    asked(twin)
    engine.tell(g, l)
    twin.tell(g, l)
    assert same_bits(engine.x, twin.x)


def test_tell_reads_lists_of_real_numbers_as_float64() -> None:
    engines = [optex.OptEx(X0, **CONFIG) for _ in range(4)]
    g, l = asked(engines[0])
    for e in engines[1:]:
        asked(e)
    engines[0].tell(g, l)
    engines[1].tell(g.tolist(), l.tolist())
    engines[2].tell([list(row) for row in g], tuple(np.float64(v) for v in l))  # numpy scalars
    engines[3].tell([row for row in g], [float(v) for v in l])  # a list of float64 rows
    for e in engines[1:]:
        assert same_bits(e.x, engines[0].x)


# ---- OptEx.observe and the other array arguments -------------------------------------------


@pytest.mark.parametrize(
    "points, grads, message",
    [
        (lambda p: [str(v) for v in p], None, r"^points: must hold real numbers, got '.*' \(str\)"),
        (lambda p: [True] * D, None, r"^points: must hold real numbers, got True \(bool\)"),
        (None, lambda g: [str(v) for v in g], r"^grads: must hold real numbers, got '.*' \(str\)"),
        (None, lambda g: [*g.tolist()[:-1], None], r"^grads: must hold real numbers, got None"),
        (None, lambda g: [complex(v) for v in g], r"^grads: .*\(complex\) at index \(0,\)$"),
    ],
)
def test_observe_refuses_lists_of_what_is_not_a_real_number(points, grads, message: str) -> None:
    engine = optex.OptEx(X0, **CONFIG)
    twin = optex.OptEx(X0, **CONFIG)
    p = np.asarray(X0, dtype=np.float64) + 0.25
    g = np.asarray(rosenbrock(p)[1], dtype=np.float64)
    with pytest.raises(ValueError, match=message):
        engine.observe(p if points is None else points(p), g if grads is None else grads(g))
    # Nothing entered the history: the next points are the twin's.
    assert same_bits(np.array(engine.ask()), np.array(twin.ask()))
    g2, l2 = asked(optex.OptEx(X0, **CONFIG))
    engine.tell(g2, l2)
    twin.tell(g2, l2)
    engine.observe(p.tolist(), g.tolist())  # lists of real numbers are accepted
    twin.observe(p, g)
    assert same_bits(np.array(engine.ask()), np.array(twin.ask()))


def test_x0_lists_follow_the_same_rule() -> None:
    with pytest.raises(ValueError, match=r"^x0: must hold real numbers, got '1.0' \(str\) at "
                       r"index \(0,\)$"):
        optex.OptEx(["1.0", "2.0"], optex.Adam(lr=0.1))
    with pytest.raises(ValueError, match=r"^x0: must hold real numbers, got True \(bool\)"):
        optex.OptEx([0.5, True], optex.Adam(lr=0.1))
    a = optex.OptEx([1, 2.5, np.float32(3.0)], optex.Adam(lr=0.1))
    assert same_bits(a.x, np.array([1.0, 2.5, 3.0], dtype=np.float32))


# ---- optex.plan ---------------------------------------------------------------------------


class FakeTimers:
    def round(self, dim: int, parallelism: int, history: int) -> float:
        return 1e-3 * parallelism

    def step(self, dim: int) -> float:
        return 1e-4


@pytest.mark.parametrize("loss, shown", REFUSED_LOSSES,
                         ids=[f"loss{i}" for i in range(len(REFUSED_LOSSES))])
def test_plan_refuses_a_loss_that_is_not_a_real_number(loss, shown: str) -> None:
    timers = FakeTimers()
    with pytest.raises(ValueError, match="^objective: the loss it returned must be a real number"
                       ) as refused:
        optex.plan(D, 2, 4, objective=lambda x: (loss, x), round_timer=timers.round,
                   step_timer=timers.step)
    assert re.search(shown, str(refused.value)), str(refused.value)


@pytest.mark.parametrize("make, message", REFUSED_GRADIENTS,
                         ids=[f"grad{i}" for i in range(len(REFUSED_GRADIENTS))])
def test_plan_refuses_a_gradient_that_is_not_real_numbers(make, message: str) -> None:
    timers = FakeTimers()
    with pytest.raises(ValueError, match="^objective: the gradient it returned.*" + message):
        optex.plan(D, 2, 4, objective=lambda x: (1.0, make(np.asarray(x, np.float32))),
                   round_timer=timers.round, step_timer=timers.step)


@pytest.mark.parametrize("kind", range(len(ACCEPTED_LOSSES)))
def test_plan_takes_every_real_loss(kind: int) -> None:
    timers = FakeTimers()
    plan = optex.plan(D, 2, 4, objective=lambda x: (ACCEPTED_LOSSES[kind](1.5), x),
                      round_timer=timers.round, step_timer=timers.step)
    assert math.isfinite(plan.expected_round_seconds)


# ---- OptEx.set_gradient_oracle (proxy='target') -------------------------------------------


@pytest.mark.parametrize("loss, shown", REFUSED_LOSSES[:10],
                         ids=[f"loss{i}" for i in range(10)])
def test_the_gradient_oracle_loss_follows_the_rule(loss, shown: str) -> None:
    engine = optex.OptEx(X0, optex.Sgd(lr=0.01), parallelism=3, proxy="target")
    engine.set_gradient_oracle(lambda x: (loss, rosenbrock(x)[1]))
    with pytest.raises(ValueError, match="^gradient_oracle: the loss it returned must be a real "
                       "number") as refused:
        engine.ask()
    assert re.search(shown, str(refused.value)), str(refused.value)
    assert not engine.pending and engine.iteration == 0


def test_the_gradient_oracle_takes_real_losses_and_lists_as_floats() -> None:
    def run(oracle) -> np.ndarray:
        engine = optex.OptEx(X0, optex.Sgd(lr=0.001), parallelism=3, proxy="target")
        engine.set_gradient_oracle(oracle)
        g, l = asked(engine)
        engine.tell(g, l)
        return engine.x

    plain = run(lambda x: (float(rosenbrock(x)[0]), np.asarray(rosenbrock(x)[1], np.float64)))
    other = run(lambda x: (np.array([rosenbrock(x)[0]]), [float(v) for v in rosenbrock(x)[1]]))
    assert same_bits(plain, other)
    with pytest.raises(ValueError, match=r"^gradient_oracle's grad: must hold real numbers, got "
                       r"'1.0' \(str\)"):
        run(lambda x: (1.0, ["1.0"] * D))


# ---- optex.torch: the closure's loss -------------------------------------------------------


def torch_problem():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    data = torch.randn(16, 4), torch.randn(16, 1)
    opt = optex.torch.OptEx(model.parameters(), lr=0.05, parallelism=2, seed=0)

    def closure_returning(kind):
        def closure():
            opt.zero_grad()
            loss = ((model(data[0]) - data[1]) ** 2).mean()
            loss.backward()
            return kind(loss)
        return closure

    return model, opt, closure_returning


@pytest.mark.parametrize(
    "kind, shown",
    [
        (lambda loss: "loss", r"got 'loss' \(str\)"),
        (lambda loss: True, r"got True \(bool\)"),
        (lambda loss: complex(loss.item()), r"\(complex\)"),
        (lambda loss: np.array([loss.item(), 0.0]), r"an array of shape \(2,\)"),
        (lambda loss: loss > 0, r"a tensor of dtype torch.bool"),
        (lambda loss: torch.complex(loss.detach(), loss.detach()), r"a tensor of dtype torch.complex"),
    ],
)
def test_the_torch_closure_loss_follows_the_rule(kind, shown: str) -> None:
    model, opt, closure_returning = torch_problem()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"^closure: must return the loss .* must be a real number"
                       ) as refused:
        opt.step(closure_returning(kind))
    assert re.search(shown, str(refused.value)), str(refused.value)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))


@pytest.mark.parametrize("kind", [lambda loss: loss.item(), lambda loss: np.float64(loss.item()),
                                  lambda loss: np.array([loss.item()]),
                                  lambda loss: loss.reshape(1)])
def test_the_torch_closure_takes_every_real_loss_as_the_tensors_value(kind) -> None:
    runs = []
    for make in (lambda loss: loss, kind):
        model, opt, closure_returning = torch_problem()
        for _ in range(3):
            opt.step(closure_returning(make))
        runs.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(runs[0], runs[1])
