"""Under torch.distributed (gloo, 2 processes) the parameter rules and buffers= give the
single-process run bit for bit: a parameter used only at a point another rank evaluates
is still stepped on every rank, a frozen one on none, and the committed point's buffers
travel from the rank that evaluated it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from optex.torch import OptEx  # noqa: E402
from torch_models import bits, make_data  # noqa: E402

N = 3  # rank 0 evaluates points 0 and 1, rank 1 point 2
ROUNDS = 4


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.BatchNorm1d(5), torch.nn.Tanh(),
                                       torch.nn.Linear(5, 2))
        self.late = torch.nn.Parameter(torch.full((2,), 0.5))  # used at point 2 only
        self.frozen = torch.nn.Parameter(torch.ones(2), requires_grad=False)


def run() -> dict[str, bytes]:
    data = make_data()
    model = Model()
    opt = OptEx(model.parameters(), optimizer="adamw", lr=0.05, weight_decay=0.1, parallelism=N,
                seed=3, buffers=model)

    def closure():
        opt.zero_grad()
        out = model.net(data[0]) * model.frozen
        if opt.current_point == 2:
            out = out + model.late
        loss = ((out - data[1]) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(ROUNDS):
        opt.step(closure)
    return {name: bits(t) for name, t in [*model.named_parameters(), *model.named_buffers()]}


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        torch.save(run(), os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_parameter_rules_and_buffers_equal_the_single_process_run(tmp_path: Path, monkeypatch) -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch has no torch.distributed with the gloo backend")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = run()
    finally:
        torch.set_num_threads(before)
    initial = Model()
    assert single["late"] != bits(initial.late)  # stepped: point 2 gives it a gradient
    assert single["frozen"] == bits(initial.frozen)
    assert single["net.1.num_batches_tracked"] == bits(torch.tensor(ROUNDS))
    for r in range(2):
        result = torch.load(tmp_path / f"rank{r}.pt", weights_only=True)
        assert result == single, f"rank {r}: {[k for k in single if result[k] != single[k]]}"
