"""Under DistributedDataParallel with ``distributed=False`` (every rank evaluates all N
points; DDP's backward averages the gradients) the ranks commit the same iterate
every round even though each rank's losses are its own (its half of the batch):
the round's decision is collective (exchange.Replicas). Two gloo ranks, spawned.

The right value is computed independently: one process evaluates both halves at
each point and averages as DDP and the replicas do (gradients g0 / 2 + g1 / 2 in
float32, losses (L0 + L1) / 2 in float64); the ranks must end bit for bit there.
Variants: OptEx's mode, the adaptive strategy, the verified mode, proxy="target" (its
oracle sees each rank's own loss), and a loss that is NaN on one rank only
(drop_nonfinite: both ranks drop that point)."""

from __future__ import annotations

import math
import os

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from optex.torch import OptEx  # noqa: E402
from torch_models import bits, flat, make_data  # noqa: E402

N = 4
ROUNDS = 8
VARIANTS = {
    "optex": {},
    "adaptive": {"strategy": "adaptive"},
    "verified": {"mode": "verified", "tolerance": 0.0, "history": 8},
    "nan_on_rank_1": {"drop_nonfinite": True},
    "target": {"proxy": "target"},  # the oracle, called inside ask(), sees this rank's loss
}
NAN_ROUND, NAN_POINT = 3, 2  # where rank 1's loss is NaN in the "nan_on_rank_1" variant


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))


def halves() -> list[tuple[torch.Tensor, torch.Tensor]]:
    x, y = make_data(rows=16)
    return [(x[:8], y[:8]), (x[8:], y[8:])]


def half_loss(model: torch.nn.Module, half: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return ((model(half[0]) - half[1]) ** 2).mean()


def poisoned(opt: OptEx, variant: str, rank: int) -> bool:
    return (variant == "nan_on_rank_1" and rank == 1 and opt.iteration == NAN_ROUND
            and opt.current_point == NAN_POINT)


def rank_run(rank: int, variant: str) -> bytes:
    """This rank's run: DDP over the model, each rank on its half of the batch."""
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = OptEx(ddp.parameters(), lr=0.05, parallelism=N, seed=3, distributed=False,
                **VARIANTS[variant])
    half = halves()[rank]

    def closure():
        opt.zero_grad()
        loss = half_loss(ddp, half)
        loss.backward()
        return loss * math.nan if poisoned(opt, variant, rank) else loss

    for _ in range(ROUNDS):
        opt.step(closure)
    return bits(flat(model.parameters()))


def reference_run(variant: str) -> bytes:
    """One process: both halves at each point, averaged as DDP and the replicas do."""
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=3, **VARIANTS[variant])

    def closure():
        grads, losses = [], []
        for rank, half in enumerate(halves()):
            model.zero_grad(set_to_none=True)
            loss = half_loss(model, half)
            loss.backward()
            grads.append([p.grad.clone() for p in model.parameters()])
            losses.append(math.nan if poisoned(opt, variant, rank) else float(loss.detach()))
        for p, g0, g1 in zip(model.parameters(), *grads):
            p.grad = g0 / 2 + g1 / 2  # DDP: each rank's gradient divided by W, then summed
        return (losses[0] + losses[1]) / 2

    for _ in range(ROUNDS):
        opt.step(closure)
    return bits(flat(model.parameters()))


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        results = {variant: rank_run(rank, variant) for variant in VARIANTS}
        results["refused"] = refused_without_ddp(rank)
        results["independent"] = independent_runs(rank)
        results["buffers"] = buffers_run(rank)
        results["verified_shared"] = verified_gated_run()
        results["changed"] = {shared: changed_outside_step(rank, shared) for shared in (False, True)}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def refused_without_ddp(rank: int) -> dict:
    """No DDP: each rank's gradients are its own half's. Every rank refuses the round
    (RuntimeError naming DDP), and nothing changes: the parameters, the engine's
    iterate and its round count; the round stays pending."""
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=3, distributed=False)
    half = halves()[rank]

    def closure():
        opt.zero_grad()
        loss = half_loss(model, half)
        loss.backward()
        return loss

    before = bits(flat(model.parameters()))
    try:
        opt.step(closure)
        message = ""
    except RuntimeError as error:
        message = str(error)
    return {"message": message, "unchanged": bits(flat(model.parameters())) == before,
            "iteration": opt.engine.iteration, "pending": opt.engine.pending,
            "iterate": bits(torch.from_numpy(opt.engine.x)) == before}


def independent_runs(rank: int) -> bytes:
    """process_group of this rank alone: each rank's own run, as without torch.distributed."""
    import torch.distributed as dist

    alone = [dist.new_group([r]) for r in range(2)][rank]
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=3, distributed=False,
                process_group=alone)
    half = halves()[rank]

    def closure():
        opt.zero_grad()
        loss = half_loss(model, half)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    return bits(flat(model.parameters()))


def verified_gated_run() -> tuple[bytes, int]:
    """The verified mode with a parameter that joins mid-run (test_torch_verified_parameters'
    model), its points shared between the ranks (distributed=None): which parameters had
    a gradient at each point is gathered from the rank that evaluated it, so the commit
    stops where the single-process run's does. Returns (the parameters' bits, w's steps)."""
    from test_torch_verified_parameters import Gated

    model = Gated()
    opt = OptEx(model.parameters(), optimizer="adamw", lr=0.05, parallelism=N, history=N, seed=1,
                mode="verified", tolerance=0.0)

    def closure():
        opt.zero_grad()
        loss = model.loss()
        loss.backward()
        return loss

    for _ in range(8):
        opt.step(closure)
    steps = int(opt.state_dict()["state"][0]["step"])
    return bits(torch.cat([model.w.detach(), model.late.detach()])), steps


def buffers_run(rank: int) -> dict[str, bytes]:
    """A BatchNorm model under DDP with buffers=: every rank keeps the same committed
    buffers (rank 0's) and parameters, though each rank's batch statistics are its own."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = OptEx(ddp.parameters(), lr=0.05, parallelism=N, seed=3, distributed=False, buffers=model)
    half = halves()[rank]

    def closure():
        opt.zero_grad()
        loss = half_loss(ddp, half)
        loss.backward()
        return loss

    for _ in range(4):
        opt.step(closure)
    return {name: bits(t) for name, t in [*model.named_parameters(), *model.named_buffers()]}


def changed_outside_step(rank: int, shared: bool) -> str:
    """Rank 1 changes a parameter outside step: rank 1 refuses the next step on its own
    check, and rank 0, whose parameters are fine, must refuse it too instead of waiting
    for rank 1 in the round's exchange (replicated rounds under DDP, or shared ones)."""
    model = make_model()
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if not shared else model
    opt = OptEx(wrapped.parameters(), lr=0.05, parallelism=N, seed=3, distributed=shared)
    half = halves()[rank]

    def closure():
        opt.zero_grad()
        loss = half_loss(wrapped, half)
        loss.backward()
        return loss

    opt.step(closure)
    if rank == 1:
        with torch.no_grad():
            model[0].bias.add_(1.0)
    try:
        opt.step(closure)
    except RuntimeError as error:
        return str(error)
    return ""


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch has no torch.distributed with the gloo backend")
    tmp = tmp_path_factory.mktemp("ddp")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(str(tmp / "init"), str(tmp)), nprocs=2, join=True)
    return [torch.load(tmp / f"rank{r}.pt", weights_only=True) for r in range(2)]


def single_thread(fn, *args):
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_the_ranks_commit_the_same_iterate_bit_for_bit(ranks: list[dict], variant: str) -> None:
    assert ranks[0][variant] == ranks[1][variant]
    # ... and it is the averaged run's, computed in one process.
    assert ranks[0][variant] == single_thread(reference_run, variant)
    # The training moved the parameters (the test is not vacuous).
    assert ranks[0][variant] != bits(flat(make_model().parameters()))


def test_ranks_whose_gradients_differ_are_refused_and_nothing_changes(ranks: list[dict]) -> None:
    for r, result in enumerate(ranks):
        refused = result["refused"]
        assert "DistributedDataParallel" in refused["message"], r
        assert "differs from rank 0's" in refused["message"], r
        assert refused["unchanged"] and refused["iterate"], r
        assert refused["iteration"] == 0 and refused["pending"], r


def test_a_process_group_of_one_rank_runs_alone(ranks: list[dict]) -> None:
    def alone(rank: int) -> bytes:
        model = make_model()
        opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=3)
        half = halves()[rank]

        def closure():
            opt.zero_grad()
            loss = half_loss(model, half)
            loss.backward()
            return loss

        for _ in range(3):
            opt.step(closure)
        return bits(flat(model.parameters()))

    for r in range(2):
        assert ranks[r]["independent"] == single_thread(alone, r), r
    assert ranks[0]["independent"] != ranks[1]["independent"]


@pytest.mark.parametrize("shared", [False, True], ids=["replicated", "shared"])
def test_a_step_one_rank_refuses_is_refused_on_every_rank(ranks: list[dict], shared: bool) -> None:
    assert "it was changed outside step()" in ranks[1]["changed"][shared]
    assert "another rank refused this step" in ranks[0]["changed"][shared]


def test_the_gradient_checksum_sees_one_bit_and_is_the_documented_sum() -> None:
    """exchange.gradient_checksums, against the sum computed here with Python integers:
    the row's bytes as int64 words modulo 2^64 (its ends, where a row does not start on
    an 8-byte boundary, as int32 values); one flipped bit changes it."""
    import numpy as np

    from optex.torch.exchange import gradient_checksums

    for d in (1, 2, 5, 8):
        rows = torch.randn(3, d, generator=torch.Generator().manual_seed(d))
        sums = gradient_checksums(rows)
        for i in range(3):
            values = rows[i].numpy()
            head = (i * d) % 2
            body = (d - head) // 2 * 2
            words = [int(w) for w in values[head:head + body].copy().view(np.int64)]
            ends = [int(v) for v in np.concatenate([values[:head], values[head + body:]]).view(np.int32)]
            expected = (sum(words) + sum(ends)) % 2**64
            assert int(sums[i]) % 2**64 == expected, (d, i)
        flipped = rows.clone()
        flipped.view(torch.int32)[1, d - 1] ^= 1
        assert (gradient_checksums(flipped) != sums).tolist() == [False, True, False]


def test_committed_buffers_agree_across_the_ranks(ranks: list[dict]) -> None:
    assert ranks[0]["buffers"] == ranks[1]["buffers"]
    torch.manual_seed(0)
    fresh = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3), torch.nn.Linear(3, 2))
    assert ranks[0]["buffers"]["1.running_mean"] != bits(fresh[1].running_mean)  # updated
    assert ranks[0]["buffers"]["0.weight"] != bits(fresh[0].weight)  # trained


def test_the_verified_cut_is_the_single_process_one_with_shared_points(ranks: list[dict]) -> None:
    from test_torch_verified_parameters import Gated, run

    single = single_thread(verified_gated_run)
    assert ranks[0]["verified_shared"] == ranks[1]["verified_shared"] == single
    # ... and that is the sequential run of as many steps (parallelism=1).
    model_bits, steps = single
    assert run(1, steps)[0] == model_bits
    # The late parameter joined within these rounds (the cut happened).
    assert model_bits[-8:] != bits(Gated().late.detach())
