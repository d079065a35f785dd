"""The verified mode in optex.torch keeps the sequential trajectory bit for bit when the
set of parameters with a gradient changes mid-run: a parameter that first receives a
gradient once the point crosses a threshold (a function of the point, as the mode
assumes) joins at the step the parallelism=1 run has it join, with its own step count;
one that stops receiving one is left alone from that step on."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from optex.torch import OptEx  # noqa: E402
from torch_models import bits  # noqa: E402

ROUNDS_OF_ONE = 30  # sequential steps of the parallelism=1 run
THRESHOLD = 0.8  # the late parameter is used once w.sum() exceeds it


class Gated(torch.nn.Module):
    """w is always used; `late` only where w.sum() > THRESHOLD (or, with `leaving`,
    only below it): its .grad is None at the other points."""

    def __init__(self, leaving: bool = False) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.late = torch.nn.Parameter(torch.tensor([0.5, -0.25]))
        self.leaving = leaving

    def loss(self) -> torch.Tensor:
        x = torch.tensor([[1.0, 2.0, 0.5], [0.3, -1.0, 2.0], [1.5, 0.2, 0.1]])
        y = torch.tensor([1.0, 0.5, 2.0])
        loss = ((x @ self.w - y) ** 2).mean()
        if (float(self.w.detach().sum()) > THRESHOLD) != self.leaving:
            loss = loss + ((self.late - torch.tensor([1.0, 2.0])) ** 2).sum() * (1.0 + 0.1 * self.w[0])
        return loss


def run(parallelism: int, rounds: int, leaving: bool = False, optimizer: str = "adamw",
        **hyper) -> tuple[bytes, list[int]]:
    model = Gated(leaving)
    opt = OptEx(model.parameters(), optimizer=optimizer, lr=0.05, parallelism=parallelism,
                history=max(parallelism, 2), seed=1, mode="verified", tolerance=0.0, **hyper)

    def closure():
        opt.zero_grad()
        loss = model.loss()
        loss.backward()
        return loss

    steps = []
    while len(steps) < rounds:
        opt.step(closure)
        steps.append(int(opt.state_dict()["state"][0]["step"]))
    late_steps = int(opt.state_dict()["state"].get(1, {"step": torch.tensor(0)})["step"])
    return bits(torch.cat([model.w.detach(), model.late.detach()])), [steps[-1], late_steps]


def torch_optim_run(steps: int, leaving: bool = False) -> bytes:
    """The same training with torch.optim.AdamW (its per-parameter step counts: the
    late parameter's bias correction starts at its first gradient)."""
    model = Gated(leaving)
    opt = torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        model.loss().backward()
        opt.step()
    return bits(torch.cat([model.w.detach(), model.late.detach()]))


@pytest.mark.parametrize("leaving", [False, True], ids=["joins", "leaves"])
@pytest.mark.parametrize("parallelism", [3, 4])
def test_verified_mode_is_the_sequential_run_bit_for_bit(parallelism: int, leaving: bool) -> None:
    one_bits, one_counts = run(1, ROUNDS_OF_ONE, leaving=leaving)
    # The gate switches inside the run (the test is not vacuous): the late parameter
    # was stepped, but fewer times than w.
    assert 0 < one_counts[1] < one_counts[0] == ROUNDS_OF_ONE
    many_bits, many_counts = run(parallelism, ROUNDS_OF_ONE, leaving=leaving)
    # The verified rounds took several steps each; compare after the same number of steps.
    assert many_counts[0] >= ROUNDS_OF_ONE
    one_bits, one_counts = run(1, many_counts[0], leaving=leaving)
    assert many_counts == one_counts
    assert many_bits == one_bits


def test_parallelism_one_follows_torch_optim() -> None:
    """The reference itself is torch.optim's per-parameter rule (within float32
    rounding: the engine's AdamW and torch's single-tensor one differ in the last bits)."""
    ours, counts = run(1, ROUNDS_OF_ONE)
    theirs = bits_to_tensor(torch_optim_run(ROUNDS_OF_ONE))
    assert torch.allclose(bits_to_tensor(ours), theirs, rtol=1e-5, atol=1e-6)
    assert counts[1] < counts[0]


def bits_to_tensor(b: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(b), dtype=torch.float32)


@pytest.mark.parametrize("drop_nonfinite", [False, True])
def test_a_non_finite_value_after_the_cut_is_still_the_engines_to_refuse(drop_nonfinite: bool) -> None:
    """The cut tells the points after it as NaN with drop_nonfinite; a round holding a
    NaN loss of its own is still refused without drop_nonfinite (ValueError, nothing
    changed, the round pending), and with it the commit stops at the cut."""
    model = Gated()
    opt = OptEx(model.parameters(), optimizer="adamw", lr=0.05, parallelism=4, history=4, seed=1,
                mode="verified", tolerance=0.0, drop_nonfinite=drop_nonfinite)

    def closure():
        opt.zero_grad()
        loss = ((model.w - 1.0) ** 2).sum()
        if opt.current_point >= 2:  # late gets a gradient from point 2 on: the cut is at 2
            loss = loss + (model.late ** 2).sum()
        loss.backward()
        poisoned = opt.iteration >= 1 and opt.current_point == 3
        return loss * float("nan") if poisoned else loss

    opt.step(closure)  # a first round without a NaN
    before = bits(torch.cat([model.w.detach(), model.late.detach()]))
    steps = int(opt.state_dict()["state"][0]["step"])
    if not drop_nonfinite:
        with pytest.raises(ValueError, match="element 3 is nan .*must be finite"):
            opt.step(closure)
        assert opt.engine.pending
        assert bits(torch.cat([model.w.detach(), model.late.detach()])) == before
    else:
        opt.step(closure)
        # At most the two steps before the cut, and the late parameter not stepped.
        assert 1 <= int(opt.state_dict()["state"][0]["step"]) - steps <= 2
        assert bits(model.late.detach()) == bits(torch.tensor([0.5, -0.25]))  # never stepped
