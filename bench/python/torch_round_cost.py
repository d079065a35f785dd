"""The cost of one optex.torch.OptEx round against one torch.optim.Adam step, on CPU or a GPU.

    PYTHONPATH=python python bench/python/torch_round_cost.py --threads 1 --output round-cost.md
    python bench/python/torch_round_cost.py --device cuda --output cuda.md --output cuda.json

Models (``--models``), on scikit-learn's bundled digits (digits.py's training split,
pixels in [0, 1]), cross-entropy loss:

- ``mlp``: 64-32-10 with tanh, digits.py's MLP (2410 parameters).
- ``cnn``: conv(1->16, 3x3)-relu-conv(16->32, 3x3)-relu-maxpool(2)-linear(128->10)
  on the 8x8 images (6218 parameters).

Cases, each on its own copy of the model, all with minibatches of ``--batch-size``
examples from one pool drawn once from ``--seed``:

- ``adam_step``: zero_grad, forward, backward, ``torch.optim.Adam.step`` on one minibatch.
- ``optex_sequential``: one ``OptEx.step`` (N = ``--parallelism``, default options)
  with an ordinary closure that evaluates the minibatch of row ``opt.current_point``:
  N forward and backward passes one after another.
- ``optex_batched``: the same round with ``optex.torch.BatchedClosure`` over the same
  per-row minibatches: the N rows in one vectorized call.
- ``engine_only``: the engine's share of a round: ``optex.OptEx`` ask and tell with
  the same dimension and options, fed the gradient of a quadratic (numpy).
- ``batched_evaluation``: the vectorized evaluation's share:
  ``BatchedClosure.evaluate_rows`` on one fixed (N, d) point matrix.
- ``stacked_evaluation``: forward and backward of one model on the N minibatches
  stacked into one batch: the arithmetic of the N evaluations without per-row
  parameters, a floor for any batched evaluation.

Every case first runs ``--warmup`` times untimed (which also fills OptEx's history,
32 pairs by default, so the timed rounds fit the full GP). Then come
``--repetitions`` repetitions; in each, every case runs as one block, in an order
rotated by one case per repetition, so slow phases of a shared machine fall on all
cases alike. A block runs the operation once untimed, then ``--block`` times
timed back to back, and counts the window over the count as one operation's time:
a training loop repeats one operation with its code and data in the caches,
while an operation timed right after the other cases runs up to twice as slow.
Each window is timed twice: wall-clock, and the CPU time of the calling thread
(``time.thread_time``), which leaves out the time other processes hold the core.
Reported per case and clock: the median and interquartile range (IQR) over the
repetitions of one operation's time, and its ratio to ``adam_step``'s median on
the same clock.
``--threads`` sets ``torch.set_num_threads`` (default 1: all of torch's and the
engine's CPU work then runs on the calling thread, so the thread clock holds all
of it, and other processes on the machine disturb the measurement less; with more
threads, the thread clock misses torch's worker threads).

``--device cuda`` puts the models, the minibatches and so the engine on the current GPU
(an optex built with CUDA runs its engine there; ``engine_only`` then feeds it device rows
through DLPack); each timed window then ends with ``torch.cuda.synchronize()``, so the
wall clock holds the device's work, while the thread clock holds only the host's share
(launches, the engine's host side).

The table is printed; ``--output`` (repeatable) also writes it as Markdown (``.md``) or
the numbers as JSON (``.json``).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from digits import load_split  # noqa: E402
from records import command_line, machine_description, today  # noqa: E402

MODELS = ("mlp", "cnn")
OUTPUT_SUFFIXES = (".md", ".json")
# A round within this factor of one Adam step meets the goal the benchmark checks against.
GOAL_RATIO = 2.0


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--repetitions", type=int, default=100, help="timed repetitions of every case")
    parser.add_argument("--block", type=int, default=10, help="operations timed together in one repetition")
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs of every case first")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--parallelism", type=int, default=4, help="N, the evaluations of a round")
    parser.add_argument("--batch-size", type=int, default=64, help="examples per minibatch")
    parser.add_argument("--seed", type=int, default=0, help="model initialisation and minibatches")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where the models, data and engine live (default cpu)")
    parser.add_argument("--output", action="append", default=[],
                        help="also write the results: a .md (table) or .json (numbers) path; repeatable")
    args = parser.parse_args(argv)
    for name in ("repetitions", "block", "threads", "parallelism", "batch_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup < 0:
        parser.error("--warmup must be at least 0")
    for output in args.output:
        if not output.endswith(OUTPUT_SUFFIXES):
            parser.error(f"--output must end in {' or '.join(OUTPUT_SUFFIXES)}, got {output!r}")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda: torch sees no CUDA device here")
    return args


# ---------------------------------------------------------------------------- models and data


def make_model(name: str, seed: int, device: str = "cpu") -> Any:
    import torch

    torch.manual_seed(seed)
    nn = torch.nn
    if name == "mlp":
        return nn.Sequential(nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 10)).to(device)
    return nn.Sequential(
        nn.Unflatten(1, (1, 8, 8)),
        nn.Conv2d(1, 16, 3), nn.ReLU(),
        nn.Conv2d(16, 32, 3), nn.ReLU(),
        nn.MaxPool2d(2), nn.Flatten(), nn.Linear(32 * 2 * 2, 10),
    ).to(device)


def cross_entropy(model: Any, x: Any, y: Any) -> Any:
    import torch

    return torch.nn.functional.cross_entropy(model(x), y)


class RoundBatches:
    """A pool of rounds of per-row minibatches, taken in turn: ``next_round()`` moves
    on, ``batches_for(rows)`` gives this round's minibatches of ``rows`` (stacked),
    ``row(i)`` one row's."""

    def __init__(self, x: Any, y: Any) -> None:
        self._x, self._y = x, y  # (rounds, N, batch, ...) and (rounds, N, batch)
        self._round = 0

    def next_round(self) -> None:
        self._round = (self._round + 1) % self._x.shape[0]

    def batches_for(self, rows: list[int]) -> tuple[Any, Any]:
        if rows == list(range(rows[0], rows[0] + len(rows))):  # step's rows: a view, as row() gives
            take: Any = slice(rows[0], rows[0] + len(rows))
        else:
            take = rows
        return self._x[self._round, take], self._y[self._round, take]

    def row(self, i: int) -> tuple[Any, Any]:
        return self._x[self._round, i], self._y[self._round, i]


def batch_pool(args: argparse.Namespace, rounds: int = 16) -> tuple[Any, Any]:
    """(rounds, N, batch, 64) features and (rounds, N, batch) labels from the training split."""
    import torch

    x_train, y_train, _, _ = load_split()
    rng = np.random.default_rng(args.seed)
    rows = rng.integers(0, len(y_train), size=(rounds, args.parallelism, args.batch_size))
    return (torch.tensor(x_train[rows], dtype=torch.float32, device=args.device),
            torch.tensor(y_train[rows], dtype=torch.int64, device=args.device))


# ---------------------------------------------------------------------------- cases


def make_cases(model_name: str, args: argparse.Namespace) -> tuple[dict[str, Callable[[], None]], int]:
    """The cases' operations (each on its own model, optimizer and batch cursor), and d."""
    import torch

    import optex
    import optex.torch
    from optex.torch.layout import FlatLayout

    x, y = batch_pool(args)

    adam_model = make_model(model_name, args.seed, args.device)
    adam = torch.optim.Adam(adam_model.parameters(), lr=1e-3)
    adam_batches = RoundBatches(x, y)

    def adam_step() -> None:
        adam_batches.next_round()
        adam.zero_grad()
        cross_entropy(adam_model, *adam_batches.row(0)).backward()
        adam.step()

    sequential_model = make_model(model_name, args.seed, args.device)
    sequential = optex.torch.OptEx(sequential_model.parameters(), lr=1e-3, parallelism=args.parallelism,
                                   seed=args.seed)
    sequential_batches = RoundBatches(x, y)

    def closure() -> Any:
        sequential.zero_grad()
        loss = cross_entropy(sequential_model, *sequential_batches.row(sequential.current_point))
        loss.backward()
        return loss

    def optex_sequential() -> None:
        sequential_batches.next_round()
        sequential.step(closure)

    batched_model = make_model(model_name, args.seed, args.device)
    batched = optex.torch.OptEx(batched_model.parameters(), lr=1e-3, parallelism=args.parallelism,
                                seed=args.seed)
    batched_batches = RoundBatches(x, y)
    batched_closure = optex.torch.BatchedClosure(batched_model, cross_entropy, batched_batches)

    def optex_batched() -> None:
        batched_batches.next_round()
        batched.step(batched_closure)

    d = sum(p.numel() for p in batched_model.parameters())
    minimum = np.random.default_rng(args.seed).normal(size=d).astype(np.float32)
    if args.device == "cuda" and optex.built_with_cuda():
        # The engine on the GPU, fed device rows as optex.torch feeds it.
        engine = optex.OptEx(np.zeros(d, np.float32), optex.Adam(lr=1e-3), parallelism=args.parallelism,
                             seed=args.seed, device=f"cuda:{torch.cuda.current_device()}")
        device_minimum = torch.from_numpy(minimum).cuda()

        def engine_only() -> None:
            points = torch.from_dlpack(engine.device_points())
            grads = torch.from_dlpack(engine.device_grads())
            torch.sub(points, device_minimum, out=grads)
            losses = 0.5 * (grads.double() ** 2).sum(dim=1)
            engine.tell_device(losses.cpu().numpy())  # .cpu() synchronises the writes
    else:
        engine = optex.OptEx(np.zeros(d, np.float32), optex.Adam(lr=1e-3), parallelism=args.parallelism,
                             seed=args.seed)

        def engine_only() -> None:
            points = np.asarray(engine.ask())
            engine.tell(points - minimum, 0.5 * ((points - minimum) ** 2).sum(axis=1, dtype=np.float64))

    # evaluate_rows as step calls it, at N copies of the model's starting point.
    layout = FlatLayout([list(batched_model.parameters())])
    points = layout.flatten().repeat(args.parallelism, 1)
    grads = torch.empty(args.parallelism, d, device=args.device)
    losses = torch.empty(args.parallelism, dtype=torch.float64, device=args.device)
    evaluation_batches = RoundBatches(x, y)
    evaluation_closure = optex.torch.BatchedClosure(batched_model, cross_entropy, evaluation_batches)

    def batched_evaluation() -> None:
        evaluation_batches.next_round()
        evaluation_closure.evaluate_rows(layout, points, range(args.parallelism), grads, losses)

    stacked_model = make_model(model_name, args.seed, args.device)
    stacked_batches = RoundBatches(x, y)
    rows = list(range(args.parallelism))

    def stacked_evaluation() -> None:
        stacked_batches.next_round()
        stacked_x, stacked_y = stacked_batches.batches_for(rows)
        stacked_model.zero_grad()
        cross_entropy(stacked_model, stacked_x.flatten(0, 1), stacked_y.flatten(0, 1)).backward()

    operations = {"adam_step": adam_step, "optex_sequential": optex_sequential,
                  "optex_batched": optex_batched, "engine_only": engine_only,
                  "batched_evaluation": batched_evaluation, "stacked_evaluation": stacked_evaluation}
    return operations, d


CLOCKS = ("wall", "thread")


def time_cases(operations: dict[str, Callable[[], None]], repetitions: int, block: int,
               warmup: int, synchronize: Callable[[], None] = lambda: None) -> dict[str, dict[str, list[float]]]:
    """{case: {clock: seconds of one operation, per repetition}} (see the module docstring);
    ``synchronize`` waits for the device's queued work (a no-op on the CPU)."""
    names = list(operations)
    for name in names:
        for _ in range(warmup):
            operations[name]()
    synchronize()
    seconds: dict[str, dict[str, list[float]]] = {name: {clock: [] for clock in CLOCKS} for name in names}
    # As timeit: no garbage collection while timing, which would charge one case for
    # every case's garbage.
    gc.collect()
    gc.disable()
    try:
        for rep in range(repetitions):
            shift = rep % len(names)
            for name in names[shift:] + names[:shift]:
                operation = operations[name]
                operation()
                synchronize()
                wall, thread = time.perf_counter(), time.thread_time()
                for _ in range(block):
                    operation()
                synchronize()
                seconds[name]["thread"].append((time.thread_time() - thread) / block)
                seconds[name]["wall"].append((time.perf_counter() - wall) / block)
    finally:
        gc.enable()
    return seconds


@dataclasses.dataclass(frozen=True)
class Timing:
    """One case on one clock, in microseconds."""

    median_us: float
    q1_us: float
    q3_us: float
    ratio_to_adam: float  # this median over adam_step's median on the same clock


@dataclasses.dataclass(frozen=True)
class CaseResult:
    model: str
    case: str
    wall: Timing
    thread: Timing


def summarise(model: str, seconds: dict[str, dict[str, list[float]]]) -> list[CaseResult]:
    def quartiles(case: str, clock: str) -> list[float]:
        return [float(q) * 1e6 for q in np.percentile(seconds[case][clock], [25, 50, 75])]

    def timing(case: str, clock: str) -> Timing:
        q1, median, q3 = quartiles(case, clock)
        return Timing(median, q1, q3, median / quartiles("adam_step", clock)[1])

    return [CaseResult(model, case, timing(case, "wall"), timing(case, "thread")) for case in seconds]


# ---------------------------------------------------------------------------- output


def table(results: list[CaseResult]) -> str:
    lines = ["| model | case | wall median (us) | wall IQR (us) | wall ratio | "
             "thread CPU median (us) | thread CPU IQR (us) | thread CPU ratio |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        cells = [f"{t.median_us:.0f} | {t.q1_us:.0f} - {t.q3_us:.0f} | {t.ratio_to_adam:.2f}"
                 for t in (r.wall, r.thread)]
        lines.append(f"| {r.model} | {r.case} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def goal_lines(results: list[CaseResult]) -> list[str]:
    """Whether each model's batched round met the goal (at most GOAL_RATIO Adam steps)."""
    lines = []
    for r in results:
        if r.case == "optex_batched":
            verdict = "meets" if max(r.wall.ratio_to_adam, r.thread.ratio_to_adam) <= GOAL_RATIO else "misses"
            lines.append(f"{r.model}: a batched round costs {r.wall.ratio_to_adam:.2f} Adam steps "
                         f"(wall) and {r.thread.ratio_to_adam:.2f} (thread CPU), which {verdict} "
                         f"the goal of at most {GOAL_RATIO:g}.")
    return lines


def device_description(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def document(args: argparse.Namespace, dims: dict[str, int], results: list[CaseResult]) -> dict[str, Any]:
    import torch

    return {
        "benchmark": "torch_round_cost",
        "command": command_line(),
        "date": today(),
        "machine": machine_description(),
        "torch": torch.__version__,
        "device": device_description(args.device),
        "threads": args.threads,
        "repetitions": args.repetitions,
        "block": args.block,
        "warmup": args.warmup,
        "parallelism": args.parallelism,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "dimensions": dims,
        "goal_ratio": GOAL_RATIO,
        "results": [dataclasses.asdict(r) for r in results],
    }


def markdown(doc: dict[str, Any], results: list[CaseResult]) -> str:
    dims = ", ".join(f"{m} d = {d}" for m, d in doc["dimensions"].items())
    return "\n".join([
        f"# optex.torch round cost, {doc['date']}",
        "",
        f"Machine: {doc['machine']}; device: {doc['device']}; torch {doc['torch']}, {doc['threads']} thread(s). "
        f"N = {doc['parallelism']}, minibatches of {doc['batch_size']}, {dims}; "
        f"{doc['repetitions']} interleaved repetitions of blocks of {doc['block']} operations after "
        f"{doc['warmup']} warm-up runs per case.",
        "",
        f"Command: `{doc['command']}`",
        "",
        table(results),
        "",
        *goal_lines(results),
        "",
    ])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    results: list[CaseResult] = []
    dims: dict[str, int] = {}
    synchronize = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    for model in args.models:
        operations, dims[model] = make_cases(model, args)
        results += summarise(model, time_cases(operations, args.repetitions, args.block, args.warmup, synchronize))
    doc = document(args, dims, results)
    print(table(results))
    for line in goal_lines(results):
        print(line)
    for output in args.output:
        with open(output, "w") as out:
            if output.endswith(".json"):
                json.dump(doc, out, indent=1)
                out.write("\n")
            else:
                out.write(markdown(doc, results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
