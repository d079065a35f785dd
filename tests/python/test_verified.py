"""The verified mode from Python (optex.Options.verified): at tolerance 0 the committed
trajectory is the base optimizer's sequential one bit for bit, for every optimizer
class; more than one step commits per round; the window survives save/load and
state_arrays; bad options are refused naming the field; optex.torch drives it."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from conftest import float_hex

import optex
from optex import problems

D = 30


def sequential(optimizer, x0: np.ndarray, f: problems.Problem, steps: int) -> optex.OptEx:
    """N = 1: the base optimizer, bit for bit (an engine invariant)."""
    opt = optex.OptEx(x0, optimizer=optimizer, parallelism=1)
    for _ in range(steps):
        x = opt.ask()
        losses, grads = f.value_and_grad(x)
        opt.tell(grads, losses)
    return opt


def verified_rounds(opt: optex.OptEx, f: problems.Problem, rounds: int) -> list[int]:
    steps = []
    for _ in range(rounds):
        x = opt.ask()
        losses, grads = f.value_and_grad(x)
        # A guess far off the trajectory may meet an overflowing gradient: the
        # steps stop before it (its pair is dropped), exactly as without it.
        steps.append(opt.tell(grads, losses, drop_nonfinite=True).committed_steps)
    return steps


@pytest.mark.parametrize("cls", optex.optimizer_classes(), ids=lambda c: c.__name__)
def test_tolerance_zero_is_the_sequential_run_bit_for_bit(cls) -> None:
    f = problems.Rosenbrock()
    x0 = f.standard_start(D)
    optimizer = cls(lr=1e-3)
    opt = optex.OptEx(x0, optimizer=optimizer, options=optex.Options.verified(6, 0.0))
    steps = verified_rounds(opt, f, 15)
    assert all(1 <= s <= 6 for s in steps)
    reference = sequential(optimizer, x0, f, sum(steps))
    assert float_hex(opt.x) == float_hex(reference.x)
    state, expected = opt.state_arrays(history=False), reference.state_arrays(history=False)
    assert state["step"] == expected["step"] == sum(steps)
    for name, values in expected["slots"].items():
        assert float_hex(state["slots"][name]) == float_hex(values), name


def test_the_window_commits_several_steps_a_round() -> None:
    f = problems.Sphere()
    opt = optex.OptEx(f.standard_start(D), optimizer=optex.Adam(lr=0.01),
                      options=optex.Options.verified(8, 0.0))
    steps = verified_rounds(opt, f, 30)
    assert np.median(steps) >= 2, steps
    info = opt.tell(*reversed(f.value_and_grad(opt.ask())))
    assert info.disagreement == 0.0 and "committed_steps=" in repr(info)


def test_the_approximate_mode_reports_one_step_and_no_disagreement() -> None:
    f = problems.Sphere()
    opt = optex.OptEx(f.standard_start(D), parallelism=4)
    x = opt.ask()
    losses, grads = f.value_and_grad(x)
    info = opt.tell(grads, losses)
    assert info.committed_steps == 1 and np.isnan(info.disagreement)
    assert opt.options.mode == "approximate" and opt.options.tolerance == 0.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(tolerance=-1e-3), "^tolerance: must be finite and >= 0"),
        (dict(tolerance=float("nan")), "^tolerance: must be finite and >= 0"),
        (dict(tolerance=float("inf")), "^tolerance: must be finite and >= 0"),
        (dict(evaluations_per_point=2), "^evaluations_per_point: must be 1 in the verified mode"),
        (dict(strategy="adaptive"), "^strategy:"),
        (dict(proxy="target"), "^proxy:"),
        (dict(trust_region=2.0), "^trust_region:"),
        (dict(max_posterior_variance=0.5), "^max_posterior_variance:"),
        (dict(history=4), "^history: must be at least the parallelism"),
    ],
)
def test_bad_verified_options_are_refused_naming_the_field(change: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        optex.OptEx(np.zeros(3), mode="verified", parallelism=8,
                    **{**dict(tolerance=0.0, history=32), **change})
    with pytest.raises(ValueError, match="^mode:"):
        optex.Options(mode="exact")
    with pytest.raises(ValueError, match="^tolerance:"):
        optex.Options.verified(8, -1.0)


def test_the_window_survives_save_load_and_state_arrays(tmp_path: pathlib.Path) -> None:
    f = problems.Rosenbrock()
    opt = optex.OptEx(f.standard_start(D), optimizer=optex.Adam(lr=2e-3),
                      options=optex.Options.verified(6, 1e-6))
    verified_rounds(opt, f, 5)
    arrays = opt.state_arrays()
    assert 0 <= arrays["round"]["window_carried"] < 6
    opt.save(tmp_path / "run.ckpt")
    loaded = optex.OptEx.load(tmp_path / "run.ckpt")
    rebuilt = optex.OptEx.from_state_arrays(arrays)
    expected = verified_rounds(opt, f, 6)
    for other in (loaded, rebuilt):
        assert verified_rounds(other, f, 6) == expected
        assert float_hex(other.x) == float_hex(opt.x)
    # A window the history cannot hold is refused, naming the key.
    bad = opt.state_arrays()
    bad["round"]["window_carried"] = 6
    with pytest.raises(ValueError, match="window_carried"):
        optex.OptEx.from_state_arrays(bad)


def test_optex_torch_takes_the_base_optimizers_steps() -> None:
    torch = pytest.importorskip("torch")
    from optex.torch import OptEx

    def run(options: optex.Options, rounds: int) -> tuple[list[float], int]:
        torch.manual_seed(0)
        model = torch.nn.Linear(5, 1)
        data = torch.randn(32, 5)
        target = data @ torch.arange(1.0, 6.0).unsqueeze(1)
        opt = OptEx(model.parameters(), lr=1e-2, optimizer="adam", options=options)

        def closure() -> torch.Tensor:
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(data), target)
            loss.backward()
            return loss

        steps = 0
        for _ in range(rounds):
            opt.step(closure)
            steps += opt.last_info.committed_steps
        return [float(p) for p in torch.cat([q.detach().flatten() for q in model.parameters()])], steps

    verified, steps = run(optex.Options.verified(4, 0.0), 10)
    plain, _ = run(optex.Options(parallelism=1), steps)
    assert steps > 10
    assert verified == plain
