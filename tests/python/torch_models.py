"""Small deterministic models, data and closures for the optex.torch tests."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch


class TwoHeads(torch.nn.Module):
    """An MLP whose forward uses head "b" only when asked: with use_b False,
    head b's parameters get no gradient (they are not in the graph)."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.body = torch.nn.Linear(4, 6)
        self.a = torch.nn.Linear(6, 2)
        self.b = torch.nn.Linear(6, 2)
        self.use_b = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.body(x))
        return self.a(h) + (self.b(h) if self.use_b else 0.0)


def make_data(seed: int = 1, rows: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(rows, 4, generator=g), torch.randn(rows, 2, generator=g)


def loss_of(model: torch.nn.Module, data: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = data
    return ((model(x) - y) ** 2).mean()


def closure_for(opt: torch.optim.Optimizer, model: torch.nn.Module, data: Any) -> Callable[[], torch.Tensor]:
    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        return loss

    return closure


def torch_step(opt: torch.optim.Optimizer, model: torch.nn.Module, data: Any) -> None:
    """One step of a torch.optim optimizer (zero_grad with set_to_none, as its default)."""
    opt.zero_grad()
    loss_of(model, data).backward()
    opt.step()


def flat(params: Iterable[torch.Tensor]) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in params])


def bits(t: torch.Tensor) -> bytes:
    return t.detach().cpu().contiguous().numpy().tobytes()


def step_failing_on_rank_1(opt: Any, closure: Any, rank: int) -> str:
    """One step whose closure raises on rank 1 only; the message every rank gets ("" if none)."""

    def failing():
        if rank == 1:
            raise OSError("rank 1 lost its data")
        return closure()

    try:
        opt.step(failing)
    except RuntimeError as error:
        return str(error)
    return ""
