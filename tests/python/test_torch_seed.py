"""The run seed of optex.torch.OptEx follows torch: without ``seed=`` or
``options=`` it is one draw from torch's default generator at construction, so
torch.manual_seed(s) repeats a run and another s changes it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); "
                                             "not installed here")

import optex  # noqa: E402
from optex.torch import OptEx, PointBatches  # noqa: E402


def make_model() -> torch.nn.Module:
    return torch.nn.Linear(3, 1)


def run_seed_after_manual_seed(s: int) -> int:
    torch.manual_seed(s)
    return OptEx(make_model().parameters(), parallelism=2).seed


def test_the_run_seed_is_one_draw_from_torchs_generator() -> None:
    torch.manual_seed(3)
    model = make_model()
    opt = OptEx(model.parameters(), parallelism=2)
    after = torch.get_rng_state()
    torch.manual_seed(3)
    make_model()
    expected = int(torch.empty((), dtype=torch.int64).random_().item())
    assert opt.seed == expected
    assert torch.equal(after, torch.get_rng_state())  # one draw, no more


def test_manual_seed_repeats_the_run_seed_and_another_changes_it() -> None:
    assert run_seed_after_manual_seed(1) == run_seed_after_manual_seed(1)
    assert run_seed_after_manual_seed(1) != run_seed_after_manual_seed(2)


START = make_model().state_dict()
INPUTS = torch.randn(12, 3, generator=torch.Generator().manual_seed(1))
TARGETS = torch.randn(12, 1, generator=torch.Generator().manual_seed(2))


def train(manual_seed: int) -> tuple[torch.Tensor, list[list[float]], list[int]]:
    """A script as people write it, from the same weights whatever the seed: the final
    parameters, the targets of every batch, and the evaluations' seeds."""
    torch.manual_seed(manual_seed)
    model = make_model()
    model.load_state_dict(START)
    opt = OptEx(model.parameters(), lr=0.05, parallelism=4)
    batches = PointBatches(opt, (INPUTS, TARGETS), 3)
    seen, seeds = [], []

    def closure():
        inputs, targets = batches()
        seen.append(targets.flatten().tolist())
        seeds.append(opt.current_seed)
        loss = ((model(inputs) - targets) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(4):
        opt.step(closure)
    return torch.cat([p.detach().flatten() for p in model.parameters()]), seen, seeds


def test_manual_seed_repeats_the_trajectory_and_another_changes_it() -> None:
    (x1, seen1, seeds1), (x1_again, seen1_again, seeds1_again) = train(1), train(1)
    assert torch.equal(x1, x1_again) and seen1 == seen1_again and seeds1 == seeds1_again
    x2, seen2, seeds2 = train(2)
    assert seen1 != seen2 and not torch.equal(x1, x2)
    assert set(seeds1).isdisjoint(seeds2)


@pytest.mark.parametrize("how", ["seed", "options"])
def test_an_explicit_seed_or_options_draw_nothing(how: str) -> None:
    given = {"seed": 4} if how == "seed" else {"options": optex.Options(parallelism=2, seed=8)}
    torch.manual_seed(3)
    model = make_model()
    before = torch.get_rng_state()
    opt = OptEx(model.parameters(), **given)
    assert torch.equal(before, torch.get_rng_state())
    assert opt.seed == (4 if how == "seed" else 8)


def test_a_refused_construction_draws_nothing() -> None:
    model = make_model()
    torch.manual_seed(3)
    before = torch.get_rng_state()
    with pytest.raises(ValueError, match="lr"):
        OptEx(model.parameters(), lr=-1.0)
    with pytest.raises(ValueError, match="parallelism"):
        OptEx(model.parameters(), parallelism=0)
    assert torch.equal(before, torch.get_rng_state())
