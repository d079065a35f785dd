"""Bit for bit against the C++ library driven directly (the reference program).

The reference is an independent C++ client of optex::Engine and
optex::problems, not code inside the module: a binding that rounded, copied or
ordered anything differently from a C++ user's loop would show here.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import Reference, double_hex, float_hex, parse_floats

import optex
from optex import problems

PROBLEMS = {
    "sphere": problems.Sphere,
    "rosenbrock": problems.Rosenbrock,
    "ackley": problems.Ackley,
    "rastrigin": problems.Rastrigin,
    "levy": problems.Levy,
    "griewank": problems.Griewank,
    "styblinski_tang": problems.StyblinskiTang,
    "schwefel": problems.Schwefel,
}

# (reference program arguments, the same run's optimizer in Python)
CONFIGS = [
    pytest.param(
        dict(problem="rosenbrock", dim=20, optimizer="adam", lr=0.02, parallelism=4, iterations=25),
        optex.Adam(lr=0.02),
        id="rosenbrock-adam-default",
    ),
    pytest.param(
        dict(problem="rastrigin", dim=50, optimizer="sgd", lr=1e-3, momentum=0.9, nesterov=1,
             preset="reference", parallelism=5, seed=7, iterations=20),
        optex.Sgd(lr=1e-3, momentum=0.9, nesterov=True),
        id="rastrigin-nesterov-reference",
    ),
    pytest.param(
        dict(problem="levy", dim=30, optimizer="adamw", lr=0.01, weight_decay=0.05, parallelism=3,
             history=8, seed=3, iterations=20),
        optex.AdamW(lr=0.01, weight_decay=0.05),
        id="levy-adamw-history8",
    ),
    pytest.param(
        dict(problem="sphere", dim=16, optimizer="adam", lr=0.05, parallelism=3, proxy="target",
             iterations=10),
        optex.Adam(lr=0.05),
        id="sphere-target-oracle",
    ),
    pytest.param(
        dict(problem="griewank", dim=10, optimizer="sgd", lr=1.0, weight_decay=1e-3, parallelism=2,
             proxy="last_gradient", iterations=10),
        optex.Sgd(lr=1.0, weight_decay=1e-3),
        id="griewank-last-gradient",
    ),
    pytest.param(
        dict(problem="ackley", dim=12, optimizer="adam", lr=0.01, parallelism=1, iterations=10),
        optex.Adam(lr=0.01),
        id="ackley-n1",
    ),
]


def python_options(args: dict) -> optex.Options:
    n = args.get("parallelism", 4)
    options = optex.Options.reference(n) if args.get("preset") == "reference" else optex.Options()
    options.parallelism = n
    if "history" in args:
        options.history = args["history"]
    options.proxy = args.get("proxy", "gp")
    options.seed = args.get("seed", 0)
    return options


def record(opt: optex.OptEx, info: optex.IterationInfo, seeds: np.ndarray) -> dict[str, str]:
    """One line of the reference program's output, from the Python side."""
    return {
        "iteration": str(info.iteration),
        "x": float_hex(opt.x),
        "loss": double_hex(info.loss),
        "best_loss": double_hex(info.best_loss),
        "grad_norm": double_hex(info.grad_norm),
        "cosine": double_hex(info.cosine),
        "lengthscale": double_hex(info.lengthscale),
        "seeds": "".join(f"{s:016x}" for s in seeds.tolist()),
    }


def python_run(opt: optex.OptEx, problem: problems.Problem, iterations: int,
               as_float64: bool = False) -> list[dict[str, str]]:
    lines = []
    for _ in range(iterations):
        points = opt.ask()
        seeds = opt.seeds
        losses, grads = problem.value_and_grad(points)
        if as_float64:
            grads = grads.astype(np.float64)
        info = opt.tell(grads, losses)
        lines.append(record(opt, info, seeds))
    return lines


def make_engine(args: dict, optimizer) -> tuple[optex.OptEx, problems.Problem]:
    problem = PROBLEMS[args["problem"]]()
    opt = optex.OptEx(problem.standard_start(args["dim"]), optimizer=optimizer,
                      options=python_options(args))
    if args.get("proxy") == "target":
        opt.set_gradient_oracle(problem.value_and_grad)
    return opt, problem


@pytest.mark.parametrize(("args", "optimizer"), CONFIGS)
def test_trajectory_matches_cpp_bit_for_bit(reference: Reference, args: dict, optimizer) -> None:
    expected = reference.run("trajectory", **args)
    opt, problem = make_engine(args, optimizer)
    got = python_run(opt, problem, args["iterations"])
    assert len(got) == len(expected) == args["iterations"]
    for t, (g, e) in enumerate(zip(got, expected)):
        assert g == e, f"iteration {t + 1} differs from the C++ engine"


def test_float64_gradients_give_the_same_trajectory(reference: Reference) -> None:
    # float32 gradients widened to float64 round back exactly: the same run.
    args = dict(problem="styblinski_tang", dim=24, optimizer="adam", lr=0.05, parallelism=4,
                iterations=15)
    expected = reference.run("trajectory", **args)
    opt, problem = make_engine(args, optex.Adam(lr=0.05))
    assert python_run(opt, problem, args["iterations"], as_float64=True) == expected


def test_numpy_gradients_match_cpp(reference: Reference) -> None:
    # Gradients computed by numpy rather than optex.problems: 2 x is exact in
    # float32, so the iterates must still agree bit for bit with the C++ run.
    args = dict(problem="sphere", dim=32, optimizer="sgd", lr=0.1, momentum=0.5, parallelism=4,
                seed=11, iterations=15)
    expected = reference.run("trajectory", **args)
    opt = optex.OptEx(np.ones(32), optimizer=optex.Sgd(lr=0.1, momentum=0.5), parallelism=4,
                      seed=11)
    for line in expected:
        points = opt.ask()
        grads = [list(map(float, 2.0 * row)) for row in points]  # lists of Python floats
        losses = [float(np.dot(row.astype(np.float64), row)) for row in points]
        opt.tell(grads, losses)
        assert float_hex(opt.x) == line["x"]


def test_cpp_checkpoint_resumes_in_python(reference: Reference, tmp_path) -> None:
    args = dict(problem="rosenbrock", dim=10, optimizer="adam", lr=0.02, parallelism=4,
                iterations=12)
    path = tmp_path / "cpp.ckpt"
    expected = reference.run("trajectory", save_at=5, save_path=path, **args)
    opt = optex.OptEx.load(path)
    assert opt.iteration == 5
    got = python_run(opt, problems.Rosenbrock(), 7)
    assert [line["x"] for line in got] == [line["x"] for line in expected[5:]]
    assert got == expected[5:]


def test_python_checkpoint_resumes_in_cpp(reference: Reference, tmp_path) -> None:
    args = dict(problem="levy", dim=10, optimizer="sgd", lr=0.01, momentum=0.9, parallelism=3,
                iterations=10)
    opt, problem = make_engine(args, optex.Sgd(lr=0.01, momentum=0.9))
    python_run(opt, problem, 4)
    path = tmp_path / "python.ckpt"
    opt.save(path)
    expected_rest = python_run(opt, problem, 6)
    got = reference.run("trajectory", problem="levy", dim=10, iterations=6, load_path=path)
    assert got == expected_rest


EVALUATIONS = [
    pytest.param(dict(problem=name, dim=dim), id=f"{name}-{dim}")
    for name in PROBLEMS
    for dim in (2, 7)
] + [
    pytest.param(dict(problem="rastrigin", dim=9, rotated_seed=4), id="rotated-rastrigin"),
    pytest.param(dict(problem="ackley", dim=5, noise_sigma=0.5, noise_seed=2), id="noisy-ackley"),
    pytest.param(dict(problem="griewank", dim=6, rotated_seed=1, noise_sigma=1.0, noise_seed=9),
                 id="rotated-noisy-griewank"),
]


def python_problem(args: dict) -> problems.Problem:
    p = PROBLEMS[args["problem"]]()
    if "noise_sigma" in args:
        p = problems.WithGradientNoise(p, args["noise_sigma"], args["noise_seed"])
    if "rotated_seed" in args:
        p = problems.Rotated(p, args["dim"], args["rotated_seed"])
    return p


@pytest.mark.parametrize("args", EVALUATIONS)
def test_problems_match_cpp_bit_for_bit(reference: Reference, args: dict) -> None:
    expected = reference.run("evaluate", points=4, seed=5, **args)
    p = python_problem(args)
    points = np.stack([parse_floats(line["x"]) for line in expected])
    # The same points from the Python binding of uniform_start.
    lo, hi = p.domain
    for k, row in enumerate(points):
        assert float_hex(problems.uniform_start(args["dim"], lo, hi, 5 + k)) == float_hex(row)
    losses, grads = p.value_and_grad(points)  # one batch
    for k, line in enumerate(expected):
        assert double_hex(losses[k]) == line["loss"]
        assert float_hex(grads[k]) == line["grad"]
        loss, grad = p.value_and_grad(points[k])  # one point
        assert double_hex(loss) == line["loss"]
        assert float_hex(grad) == line["grad"]
        assert double_hex(p(points[k])) == line["loss"]
