"""optex.torch.PointBatches: every evaluation of every round gets its own minibatch,
walking epochs without replacement, as a function of the seed and the evaluation's
number (rounds committed x N + row) alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); "
                                             "not installed here")

from optex.torch import OptEx, PointBatches  # noqa: E402
from test_torch import one_thread  # noqa: E402

SAMPLES = 10


def make_model() -> torch.nn.Module:
    return torch.nn.Linear(3, 1)


def make_data(samples: int = SAMPLES) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs, targets, sample ids): the ids say which samples a batch holds."""
    g = torch.Generator().manual_seed(1)
    return torch.randn(samples, 3, generator=g), torch.randn(samples, 1, generator=g), torch.arange(samples)


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).clone()


class Run:
    """A model, its optimizer and PointBatches, and the batch of every evaluation."""

    def __init__(self, parallelism: int = 4, batch_size: int = 3, data=None, seed: int | None = 5,
                 batches_seed: int | None = None, **options) -> None:
        torch.manual_seed(0)
        self.model = make_model()
        optimizer_seed = {} if seed is None else {"seed": seed}
        self.opt = OptEx(self.model.parameters(), lr=0.05, parallelism=parallelism, **optimizer_seed,
                         **options)
        self.batches = PointBatches(self.opt, make_data() if data is None else data, batch_size,
                                    seed=batches_seed)
        # (round, row or None, oracle row or None, sample ids) per closure call.
        self.seen: list[tuple[int, int | None, int | None, list[int]]] = []
        self.fail_at: int | None = None  # the closure call that raises, counted from 0

    def closure(self) -> torch.Tensor:
        inputs, targets, ids = self.batches()
        self.seen.append((self.opt.iteration, self.opt.current_point, self.opt.current_oracle_row,
                          ids.tolist()))
        if self.fail_at is not None and len(self.seen) - 1 == self.fail_at:
            raise RuntimeError("the closure failed")
        loss = ((self.model(inputs) - targets) ** 2).mean()
        loss.backward()
        return loss

    def steps(self, rounds: int) -> Run:
        for _ in range(rounds):
            self.opt.step(self.closure)
        return self

    def evaluations(self) -> dict[int, list[int]]:
        """The sample ids of each evaluation, by its number k = round x N + row."""
        n = self.opt.parallelism
        return {r * n + row: ids for r, row, _, ids in self.seen if row is not None}


# ---------------------------------------------------------------------------- which batch


def test_each_row_of_a_round_sees_a_different_batch() -> None:
    run = Run(parallelism=3, batch_size=3).steps(4)
    by_round: dict[int, list[list[int]]] = {}
    for r, _, _, ids in run.seen:
        by_round.setdefault(r, []).append(ids)
    assert sorted(by_round) == [0, 1, 2, 3]
    for batches in by_round.values():
        assert len(batches) == 3
        # N = 3 batches of 3 out of 10 samples: one epoch per round, so disjoint.
        assert len({i for ids in batches for i in ids}) == 9


def test_the_rows_are_the_points_in_order() -> None:
    run = Run(parallelism=4).steps(2)
    assert [(r, row) for r, row, _, _ in run.seen] == [(r, row) for r in range(2) for row in range(4)]


def test_an_epoch_visits_each_sample_once_dropping_the_remainder() -> None:
    # 10 samples, batches of 3: 3 batches per epoch, one sample left out; N = 4, so
    # rounds straddle epochs.
    run = Run(parallelism=4, batch_size=3).steps(6)
    evaluations = run.evaluations()
    assert sorted(evaluations) == list(range(24))
    assert run.batches.batches_per_epoch == 3
    orders = []
    for epoch in range(8):
        ids = [i for k in range(3 * epoch, 3 * epoch + 3) for i in evaluations[k]]
        assert len(ids) == 9 and len(set(ids)) == 9 and set(ids) <= set(range(SAMPLES))
        orders.append(ids)
    assert len({tuple(o) for o in orders}) > 1, "every epoch in the same order"


def test_without_drop_last_the_remainder_is_a_last_smaller_batch() -> None:
    torch.manual_seed(0)
    model = make_model()
    opt = OptEx(model.parameters(), parallelism=2, seed=1)
    batches = PointBatches(opt, make_data(), 4, drop_last=False, shuffle=False)
    assert batches.batches_per_epoch == 3
    seen = []

    def closure():
        inputs, targets, ids = batches()
        seen.append(ids.tolist())
        loss = ((model(inputs) - targets) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    # shuffle=False: index order, epoch after epoch.
    assert seen == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], [0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_batch_size_of_the_whole_data_is_one_batch_per_epoch() -> None:
    run = Run(parallelism=2, batch_size=SAMPLES).steps(2)
    assert [sorted(ids) for _, _, _, ids in run.seen] == [list(range(SAMPLES))] * 4


def test_rows_of_a_point_evaluated_several_times_see_different_batches() -> None:
    run = Run(parallelism=4, evaluations_per_point=2).steps(3)
    ids_by_round = {}
    for r, row, _, ids in run.seen:
        ids_by_round.setdefault(r, {})[row] = ids
    for rows in ids_by_round.values():
        # Rows 0, 1 are one point, rows 2, 3 another: each row its own batch.
        assert sorted(rows) == [0, 1, 2, 3]
        assert len({tuple(ids) for ids in rows.values()}) == 4


def test_batches_for_stacks_the_batches_of_the_rows() -> None:
    run = Run(parallelism=4, batch_size=3)
    stacked_inside = []

    def closure():
        stacked_inside.append(run.batches.batches_for([3, 0, 1]))
        return run.closure()

    before = run.batches.batches_for([0, 1, 2, 3])  # outside step: the next round's
    assert [tuple(t.shape) for t in before] == [(4, 3, 3), (4, 3, 1), (4, 3)]
    run.opt.step(closure)
    ids_by_row = {row: ids for _, row, _, ids in run.seen}
    assert [before[2][row].tolist() for row in range(4)] == [ids_by_row[row] for row in range(4)]
    inputs, targets, ids = make_data()
    for stacked in stacked_inside:
        assert stacked[2].tolist() == [ids_by_row[3], ids_by_row[0], ids_by_row[1]]
        assert torch.equal(stacked[0], inputs[stacked[2]]) and torch.equal(stacked[1], targets[stacked[2]])
    after = run.batches.batches_for([0])  # the next round's row 0: evaluation 4
    assert after[2][0].tolist() == Run(parallelism=4, batch_size=3).steps(2).evaluations()[4]


def test_batches_outside_the_closure_raise() -> None:
    run = Run()
    with pytest.raises(RuntimeError, match="outside the closure"):
        run.batches()
    run.steps(1)
    with pytest.raises(RuntimeError, match="outside the closure"):
        run.batches()


# ---------------------------------------------------------------------------- seeds and retries


def test_the_same_seed_repeats_the_batches_and_the_trajectory() -> None:
    first, second = Run(batches_seed=11).steps(5), Run(batches_seed=11).steps(5)
    assert first.seen == second.seen
    assert torch.equal(flat(first.model), flat(second.model))


def test_different_seeds_give_different_batches_and_trajectories() -> None:
    first, second = Run(batches_seed=11).steps(5), Run(batches_seed=12).steps(5)
    assert first.seen != second.seen
    assert not torch.equal(flat(first.model), flat(second.model))


def test_the_default_seed_is_the_optimizers_run_seed() -> None:
    default, explicit = Run(seed=21).steps(3), Run(seed=22, batches_seed=21).steps(3)
    assert default.batches.seed == 21 and explicit.batches.seed == 21
    assert [ids for *_, ids in default.seen] == [ids for *_, ids in explicit.seen]
    assert [ids for *_, ids in Run(seed=22).steps(3).seen] != [ids for *_, ids in default.seen]


def test_a_failed_round_is_retried_on_the_same_batches() -> None:
    reference = Run().steps(3)
    run = Run()
    run.steps(1)
    run.fail_at = 6  # round 1, row 2
    with pytest.raises(RuntimeError, match="the closure failed"):
        run.opt.step(run.closure)
    assert run.opt.iteration == 1
    failed = run.seen[4:7]
    run.fail_at = None
    run.steps(2)
    retried = run.seen[7:11]
    assert failed == retried[:3]
    assert run.seen[:4] + retried + run.seen[11:] == reference.seen
    assert torch.equal(flat(run.model), flat(reference.model))


def test_a_resumed_run_continues_with_the_same_batches() -> None:
    reference = Run().steps(4)
    first = Run().steps(2)
    state = first.opt.state_dict()
    resumed = Run(seed=99)  # another run seed, until the checkpoint brings the saved one
    resumed.model.load_state_dict(first.model.state_dict())
    resumed.opt.load_state_dict(state)
    assert resumed.opt.seed == 5 and resumed.opt.iteration == 2
    resumed.steps(2)
    assert resumed.seen == reference.seen[8:]
    assert torch.equal(flat(resumed.model), flat(reference.model))


def test_target_proxy_walks_the_batches_of_n_x_t_sequential_steps() -> None:
    """proxy='target': the oracle call at a point sees the batch of the point's row,
    so T rounds of N are N x T sequential steps on the batches 0 .. N x T - 1."""
    target = Run(parallelism=4, proxy="target", continue_from="last", batches_seed=3).steps(3)
    sequential = Run(parallelism=1, batches_seed=3).steps(12)
    oracle = {(r, oracle_row): ids for r, row, oracle_row, ids in target.seen if row is None}
    assert sorted(oracle) == [(r, j) for r in range(3) for j in range(3)]
    evaluations = target.evaluations()
    for (r, j), ids in oracle.items():
        assert ids == evaluations[4 * r + j]
    assert evaluations == sequential.evaluations()
    assert torch.equal(flat(target.model), flat(sequential.model))


def test_target_proxy_with_several_evaluations_per_point_asks_the_first_rows() -> None:
    run = Run(parallelism=6, proxy="target", evaluations_per_point=2, continue_from="last").steps(1)
    assert [oracle_row for _, row, oracle_row, _ in run.seen if row is None] == [0, 2]


def test_iteration_counts_committed_rounds() -> None:
    run = Run()
    assert run.opt.iteration == 0
    run.steps(3)
    assert run.opt.iteration == 3 == run.opt.engine.iteration


# ---------------------------------------------------------------------------- torch.distributed

DISTRIBUTED_N = 5  # over 2 ranks: rows 0-2 on rank 0, rows 3-4 on rank 1


def distributed_run(rank: int) -> dict:
    """A run with PointBatches and no seed=; the ranks draw different run seeds."""
    torch.manual_seed(0)
    model = make_model()
    torch.manual_seed(100 + rank)
    opt = OptEx(model.parameters(), lr=0.05, parallelism=DISTRIBUTED_N)
    batches = PointBatches(opt, make_data(), 3)
    seen = []

    def closure():
        inputs, targets, ids = batches()
        seen.append((opt.iteration, opt.current_point, ids.tolist()))
        loss = ((model(inputs) - targets) ** 2).mean()
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    return {"x": flat(model), "seen": seen, "seed": opt.seed}


def _distributed_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    """One rank of the distributed test (spawned by torch.multiprocessing)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.save(distributed_run(rank), os.path.join(out_dir, f"rank{rank}.pt"))
        # No rank tears gloo down while the other is still in a collective.
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_the_batches_do_not_depend_on_the_ranks_sharing_the_rows(tmp_path: Path, monkeypatch) -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch has no torch.distributed with the gloo backend")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_distributed_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]
    with one_thread():
        single = distributed_run(0)  # one process, rank 0's draw
    # The ranks run rank 0's drawn seed...
    assert ranks[0]["seed"] == ranks[1]["seed"] == single["seed"]
    assert run_seed_of(101) != single["seed"]
    # ... each evaluates its own rows, on the batches one process gives those rows...
    assert {row for _, row, _ in ranks[0]["seen"]} == {0, 1, 2}
    assert {row for _, row, _ in ranks[1]["seen"]} == {3, 4}
    assert sorted(ranks[0]["seen"] + ranks[1]["seen"]) == sorted(single["seen"])
    # ... and the run is the single-process one, bit for bit.
    for result in ranks:
        assert torch.equal(result["x"], single["x"])


def run_seed_of(manual_seed: int) -> int:
    torch.manual_seed(manual_seed)
    return OptEx(make_model().parameters()).seed


# ---------------------------------------------------------------------------- Datasets


class PairDataset(torch.utils.data.Dataset):
    """Map-style: item i is (inputs[i], targets[i], i)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.inputs, self.targets = inputs, targets

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int):
        return self.inputs[i], self.targets[i], i


def test_a_dataset_gives_the_batches_of_the_same_tensors() -> None:
    inputs, targets, _ = make_data()
    tensors, dataset = Run().steps(3), Run(data=PairDataset(inputs, targets)).steps(3)
    assert dataset.seen == tensors.seen
    assert torch.equal(flat(dataset.model), flat(tensors.model))
    stacked = dataset.batches.batches_for([1, 2])
    assert [tuple(t.shape) for t in stacked] == [(2, 3, 3), (2, 3, 1), (2, 3)]


def test_a_collate_fn_makes_the_batch() -> None:
    inputs, targets, _ = make_data()

    def collate(items):
        return (torch.stack([x for x, _, _ in items]) * 2, torch.stack([y for _, y, _ in items]),
                torch.tensor([i for _, _, i in items]))

    torch.manual_seed(0)
    model = make_model()
    opt = OptEx(model.parameters(), parallelism=2, seed=1)
    batches = PointBatches(opt, PairDataset(inputs, targets), 3, collate_fn=collate)
    seen = []

    def closure():
        x, y, ids = batches()
        seen.append(torch.equal(x, inputs[ids] * 2) and torch.equal(y, targets[ids]))
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        return loss

    opt.step(closure)
    assert seen == [True, True]


def test_a_dataset_with_a_nonfinite_sample_refuses_its_batch_and_the_round() -> None:
    inputs, targets, _ = make_data()
    inputs[4, 1] = float("nan")
    run = Run(parallelism=4, batch_size=5, data=PairDataset(inputs, targets))
    start = flat(run.model)
    with pytest.raises(ValueError, match=r"data: the batch of samples .* NaN or infinite"):
        run.steps(1)
    assert run.opt.iteration == 0
    assert torch.equal(flat(run.model), start)


def test_huge_finite_data_passes_through_and_step_refuses_the_overflowing_loss() -> None:
    inputs, targets, ids = make_data()
    huge = (inputs * 1e30, targets, ids)
    run = Run(data=huge)
    start = flat(run.model)
    with pytest.raises(ValueError, match="finite"):
        run.steps(1)
    assert len(run.seen) == 4  # the batches were handed out; the non-finite losses were refused
    assert run.opt.iteration == 0 and run.opt.engine.iteration == 0
    assert torch.equal(flat(run.model), start)


# ---------------------------------------------------------------------------- hostile arguments


def optimizer() -> OptEx:
    return OptEx(make_model().parameters(), parallelism=2, seed=1)


class NoLength(torch.utils.data.Dataset):
    def __getitem__(self, i: int):
        return torch.zeros(2)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([torch.zeros(2)])


class Dicts(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return {"x": torch.zeros(2)}


class Empty(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 0

    def __getitem__(self, i: int):
        raise IndexError(i)


X, Y, _ = make_data()


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "pattern"),
    [
        ((torch.optim.SGD(make_model().parameters(), lr=0.1), (X, Y), 2), {}, TypeError, "optimizer"),
        ((None, (X, Y), 2), {}, TypeError, "optimizer"),
        ((..., (X, Y[:9]), 2), {}, ValueError, r"data: .*different first dimensions \[10, 9\]"),
        ((..., (), 2), {}, ValueError, "data: the tuple holds no tensors"),
        ((..., (X[:0], Y[:0]), 2), {}, ValueError, "data: holds no samples"),
        ((..., (X, [1.0] * 10), 2), {}, TypeError, r"data\[1\]"),
        ((..., (X, torch.tensor(1.0)), 2), {}, ValueError, r"data\[1\]: a 0-dim"),
        ((..., [X, Y], 2), {}, TypeError, "data: must be a tuple of tensors or a map-style"),
        ((..., X, 2), {}, TypeError, "data: must be a tuple"),
        ((..., {"x": X}, 2), {}, TypeError, "data: must be a tuple"),
        ((..., object(), 2), {}, TypeError, "data: must be a tuple"),
        ((..., Stream(), 2), {}, TypeError, "data: must be a tuple of tensors or a map-style"),
        ((..., NoLength(), 2), {}, TypeError, "data: the Dataset NoLength has no __len__"),
        ((..., Empty(), 2), {}, ValueError, "data: holds no samples"),
        ((..., Dicts(), 2), {}, TypeError, "collate_fn: must collate"),
        ((..., (X.clone().fill_(float("nan")), Y), 2), {}, ValueError, r"data\[0\]: holds NaN or infinite"),
        ((..., (X, Y.clone().fill_(float("inf"))), 2), {}, ValueError, r"data\[1\]: holds NaN or infinite"),
        ((..., (X, Y), 0), {}, ValueError, "batch_size: must be positive"),
        ((..., (X, Y), -3), {}, ValueError, "batch_size: must be positive"),
        ((..., (X, Y), True), {}, TypeError, "batch_size: must be an int"),
        ((..., (X, Y), 2.0), {}, TypeError, "batch_size: must be an int"),
        ((..., (X, Y), "2"), {}, TypeError, "batch_size: must be an int"),
        ((..., (X, Y), 11), {}, ValueError, "batch_size: 11 is larger than the data"),
        ((..., (X, Y), 2), {"seed": "1"}, TypeError, "seed: must be an int"),
        ((..., (X, Y), 2), {"seed": 1.0}, TypeError, "seed: must be an int"),
        ((..., (X, Y), 2), {"seed": True}, TypeError, "seed: must be an int"),
        ((..., (X, Y), 2), {"seed": -1}, ValueError, r"seed: must be in \[0, 2\*\*64\)"),
        ((..., (X, Y), 2), {"seed": 2**64}, ValueError, r"seed: must be in \[0, 2\*\*64\)"),
        ((..., (X, Y), 2), {"shuffle": 1}, TypeError, "shuffle: must be a bool"),
        ((..., (X, Y), 2), {"drop_last": None}, TypeError, "drop_last: must be a bool"),
        ((..., (X, Y), 2), {"collate_fn": "stack"}, TypeError, "collate_fn: must be callable"),
    ],
)
def test_bad_arguments_raise_naming_the_argument(args, kwargs, error, pattern) -> None:
    args = tuple(optimizer() if a is ... else a for a in args)
    with pytest.raises(error, match=pattern):
        PointBatches(*args, **kwargs)


def test_the_edge_arguments_are_accepted() -> None:
    opt = optimizer()
    assert PointBatches(opt, (X, Y), 11, drop_last=False).batches_per_epoch == 1
    assert PointBatches(opt, (X, Y), 10).batches_per_epoch == 1
    assert PointBatches(opt, (X, Y), 1, seed=0).seed == 0
    assert PointBatches(opt, (X, Y), 1, seed=2**64 - 1).seed == 2**64 - 1
    huge = PointBatches(opt, (X * 1e30, Y), 2)  # huge but finite: the data's business
    assert huge.batch_size == 2


@pytest.mark.parametrize(
    ("rows", "error", "pattern"),
    [
        ([], ValueError, "rows: must name at least one row"),
        ([2], ValueError, "rows: 2 is not a row of a round of N = 2"),
        ([-1], ValueError, "rows: -1 is not a row"),
        ([True], TypeError, "rows: must hold ints"),
        ([0.0], TypeError, "rows: must hold ints"),
        ([0, "1"], TypeError, "rows: must hold ints"),
        (torch.tensor([0, 1]), TypeError, "rows: must be a list of ints"),
        ("01", TypeError, "rows: must be a list of ints"),
        (0, TypeError, "rows: must be a list of ints"),
        (None, TypeError, "rows: must be a list of ints"),
    ],
)
def test_batches_for_refuses_bad_rows(rows, error, pattern) -> None:
    batches = PointBatches(optimizer(), (X, Y), 2)
    with pytest.raises(error, match=pattern):
        batches.batches_for(rows)


def test_batches_for_refuses_batches_of_different_sizes() -> None:
    model = make_model()
    opt = OptEx(model.parameters(), parallelism=2, seed=1)
    batches = PointBatches(opt, (X, Y), 4, drop_last=False, shuffle=False)
    assert [tuple(t.shape) for t in batches.batches_for([0, 1])] == [(2, 4, 3), (2, 4, 1)]

    def closure():
        inputs, targets = batches()
        loss = ((model(inputs) - targets) ** 2).mean()
        loss.backward()
        return loss

    opt.step(closure)  # evaluations 2 and 3 next: the last, smaller batch, then a full one
    with pytest.raises(ValueError, match="rows: their batches have different shapes"):
        batches.batches_for([0, 1])
