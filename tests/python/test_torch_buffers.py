"""Buffers (BatchNorm running statistics): by default every closure call updates them;
with buffers= each point starts from the round's buffers and the round keeps those the
committed point's evaluation left."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from optex.torch import OptEx  # noqa: E402
from torch_models import bits, closure_for, make_data  # noqa: E402


def bn_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.Tanh(),
                               torch.nn.Linear(5, 2))


def forward_stats_at(params: list[torch.Tensor], start_stats: list[torch.Tensor], data) -> list[torch.Tensor]:
    """The running statistics one training forward at ``params`` makes from ``start_stats``."""
    model = bn_model()
    with torch.no_grad():
        for p, v in zip(model.parameters(), params):
            p.copy_(v)
        for b, v in zip(model.buffers(), start_stats):
            b.copy_(v)
    model(data[0])
    return [b.detach().clone() for b in model.buffers()]


@pytest.mark.parametrize("continue_from", ["last", "best_loss"])
def test_the_round_keeps_the_buffers_of_its_committed_point(continue_from) -> None:
    data = make_data()
    model = bn_model()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=4, buffers=model, seed=2,
                continue_from=continue_from)
    points = {}

    def closure():
        opt.zero_grad()
        points[opt.current_point] = [p.detach().clone() for p in model.parameters()]
        loss = ((model(data[0]) - data[1]) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(4):
        start = [b.detach().clone() for b in model.buffers()]
        opt.step(closure)
        committed = opt.last_info.committed_point
        expected = forward_stats_at(points[committed], start, data)
        for b, e in zip(model.buffers(), expected):
            assert bits(b) == bits(e)
    assert int(model[1].num_batches_tracked) == 4  # one update per round


def test_without_the_option_every_evaluation_updates_the_buffers() -> None:
    data = make_data()
    model = bn_model()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=4, seed=2)
    for _ in range(3):
        opt.step(closure_for(opt, model, data))
    assert int(model[1].num_batches_tracked) == 12  # N updates per round


def test_a_failed_round_restores_the_buffers() -> None:
    data = make_data()
    model = bn_model()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=3, buffers=model, seed=2)
    opt.step(closure_for(opt, model, data))
    before = [bits(b) for b in model.buffers()]
    calls = 0

    def fails_at_the_second_point():
        nonlocal calls
        calls += 1
        opt.zero_grad()
        loss = ((model(data[0]) - data[1]) ** 2).mean()
        loss.backward()
        if calls == 2:
            raise RuntimeError("simulator crashed")
        return loss

    with pytest.raises(RuntimeError, match="simulator crashed"):
        opt.step(fails_at_the_second_point)
    assert [bits(b) for b in model.buffers()] == before


def test_buffers_argument_is_checked() -> None:
    model = bn_model()
    for bad, message in [(3, "buffers: must be a torch.nn.Module, an iterable of tensors or None"),
                         (torch.zeros(3), "buffers: must be a torch.nn.Module"),
                         ([torch.zeros(2), "x"], r"buffers\[1\]: must be a tensor"),
                         ([model[1].running_mean] * 2, "the same tensor twice")]:
        with pytest.raises(ValueError, match=message):
            OptEx(model.parameters(), buffers=bad)
    opt = OptEx(model.parameters(), buffers=list(model.buffers()))
    assert opt is not None
