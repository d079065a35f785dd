"""optex.torch under torch.distributed shares the points with optex.point_range, the
C++ DistributedEngine's split, both to choose a rank's points and to place the
gathered gradients.

Needs PyTorch with gloo (skips without, as test_torch.py); the ranks are two
processes spawned by torch.multiprocessing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

import optex  # noqa: E402
from optex.torch import OptEx  # noqa: E402
from test_torch import bits, closure_for, flat, make_data, make_model, one_thread  # noqa: E402

N = 5  # over 2 ranks: blocks of 3 and 2
STEPS = 3


def reversed_split(points: int, groups: int, group: int) -> range:
    """Another valid split: group g gets the C++ split's block of group G-1-g."""
    return optex.point_range(points, groups, groups - 1 - group)


def _worker(rank: int, world: int, init_file: str, out_dir: str, split: str) -> None:
    """One rank: a run with the split `split` ("engine", or "reversed" in place of
    optex.point_range inside optex.torch.exchange, in this process only)."""
    import torch.distributed as dist

    from optex.torch import exchange

    calls: list[tuple[int, int, int]] = []
    engine_split = exchange.point_range

    def recorded(points: int, groups: int, group: int) -> range:
        calls.append((points, groups, group))
        return (reversed_split if split == "reversed" else engine_split)(points, groups, group)

    exchange.point_range = recorded
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        data = make_data()
        model = make_model(seed=0)
        opt = OptEx(model.parameters(), lr=0.03, parallelism=N, seed=5)
        record = []
        closure = closure_for(opt, model, data, record)
        evaluated = []
        for _ in range(STEPS):
            record.clear()
            opt.step(closure)
            evaluated.append([r[0] for r in record])
        torch.save({"x": flat(model.parameters()), "evaluated": evaluated, "calls": calls},
                   os.path.join(out_dir, f"rank{rank}.pt"))
        # No rank tears gloo down while the other is still in a collective: gloo aborts
        # the process when a peer disconnects mid-operation.
        dist.barrier()
    finally:
        exchange.point_range = engine_split
        dist.destroy_process_group()


def single_process_run() -> torch.Tensor:
    with one_thread():
        data = make_data()
        model = make_model(seed=0)
        opt = OptEx(model.parameters(), lr=0.03, parallelism=N, seed=5)
        closure = closure_for(opt, model, data)
        for _ in range(STEPS):
            opt.step(closure)
        return flat(model.parameters())


@pytest.mark.parametrize("split", ["engine", "reversed"])
def test_the_ranks_evaluate_and_gather_by_point_range(split: str, tmp_path: Path, monkeypatch) -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch has no torch.distributed with the gloo backend")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(2, str(tmp_path / "init"), str(tmp_path), split), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    single = single_process_run()
    split_of = reversed_split if split == "reversed" else optex.point_range
    for r, result in enumerate(ranks):
        # Each rank evaluates the points the split gives it...
        assert all(points == list(split_of(N, 2, r)) for points in result["evaluated"]), r
        assert (N, 2, r) in result["calls"]
        # ... and the gather puts every gradient back at its point: the run is the
        # single-process one bit for bit, whichever valid split is used.
        assert bits(result["x"]) == bits(single), f"rank {r}"
