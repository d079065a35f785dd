"""What a round of optex.minimize costs on a cluster executor over the threads executor.

    python bench/python/executor_overhead.py
    python bench/python/executor_overhead.py --engines threads dask ray --json out.json

The objective is as cheap as an objective can be: the gradient of the quadratic
0.5 ||x - 1||^2 (float32, one subtraction), so a round's time is the engine's own
work (ask: N - 1 proxy steps and the GP's predictions; tell) plus what the
executor adds: shipping N points of d float32 to the workers and N gradients
back, and its scheduling latency. N = ``--parallelism`` (4).

Engines (``--engines``):

- ``threads``: ``workers="threads"`` (N threads in this process: nothing is copied);
- ``dask``: a ``distributed.LocalCluster`` of ``--dask-workers`` worker processes
  (one thread each) on this machine, ``client.get_executor(pure=False)``:
  points and gradients travel over local TCP, pickled;
- ``ray``: ``ray.init(num_cpus=--dask-workers)`` locally and
  ``optex.executors.RayExecutor`` (points of more than 100 KiB go through Ray's
  shared-memory object store).

For each dimension one ``optex.OptEx`` is continued by every engine in turn
(``minimize(f, engine, workers=...)`` continues it), in blocks of ``--block``
rounds, the engines' order rotated each repetition, so every engine meets the
same engine states (history length, GP size) and the same phases of a shared
machine. The first block of each engine is a warm-up, left out. A round's time
is the time between two consecutive rounds' callbacks. Reported per dimension
and engine: the median and interquartile range (IQR) of the round time in ms,
and the median's excess over the threads' median: the executor's overhead per
round.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any, Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from records import command_line, machine_description, quartiles, today  # noqa: E402

import optex  # noqa: E402

ENGINES = ("threads", "dask", "ray")


def quadratic(x: np.ndarray) -> tuple[float, np.ndarray]:
    """0.5 ||x - 1||^2 and its gradient, float32."""
    g = x - np.float32(1.0)
    return 0.5 * float(np.dot(g, g)), g


class Executors:
    """The engines' executors, started on first use and closed at the end."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.closers: list[Callable[[], None]] = []
        self.made: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        if name not in self.made:
            self.made[name] = getattr(self, "_" + name)()
        return self.made[name]

    def _threads(self) -> str:
        return "threads"

    def _dask(self) -> Any:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(n_workers=self.workers, threads_per_worker=1, processes=True,
                               dashboard_address=None, silence_logs=logging.ERROR)
        client = Client(cluster)
        self.closers += [cluster.close, client.close]
        return client.get_executor(pure=False)

    def _ray(self) -> Any:
        from optex.executors import RayExecutor

        pool = RayExecutor(init=dict(num_cpus=self.workers, include_dashboard=False,
                                     log_to_driver=False))
        self.closers.append(pool.shutdown)
        return pool

    def close(self) -> None:
        for close in reversed(self.closers):
            close()


def measure(dim: int, engines: list[str], executors: Executors, args: argparse.Namespace
            ) -> dict[str, list[float]]:
    """Round times in ms per engine (warm-up blocks left out)."""
    engine = optex.OptEx(np.zeros(dim, dtype=np.float32), optex.Sgd(lr=0.05),
                         parallelism=args.parallelism, seed=0)
    times: dict[str, list[float]] = {name: [] for name in engines}
    for repetition in range(args.repetitions + 1):
        shift = repetition % len(engines)
        for name in engines[shift:] + engines[:shift]:
            stamps: list[float] = []
            start = time.perf_counter()
            # max_iters bounds the engine's iteration count: one more block of rounds.
            optex.minimize(quadratic, engine, workers=executors.get(name),
                           max_iters=engine.iteration + args.block,
                           callback=lambda info, stamps=stamps: stamps.append(time.perf_counter()))
            if repetition > 0:  # the first block of each engine warms it up
                ticks = [start] + stamps
                times[name] += [1e3 * (b - a) for a, b in zip(ticks, ticks[1:])]
    return times


def table(rows: list[dict[str, Any]], engines: list[str]) -> str:
    head = "| d | " + " | ".join(f"{e} ms/round, median [IQR]" for e in engines)
    others = [e for e in engines if e != "threads"]
    head += "".join(f" | {e} overhead ms/round" for e in others) + " |"
    lines = [head, "|" + "---|" * (1 + len(engines) + len(others))]
    for row in rows:
        cells = [f"{row['dim']:.0e}".replace("e+0", "e")]
        for e in engines:
            q = row[e]
            cells.append(f"{q['median']:.2f} [{q['q1']:.2f}, {q['q3']:.2f}]")
        for e in others:
            cells.append(f"{row[e]['median'] - row['threads']['median']:+.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[10_000, 1_000_000])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=["threads", "dask"])
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--dask-workers", type=int, default=4,
                        help="local worker processes (default 4: one per evaluation)")
    parser.add_argument("--block", type=int, default=25, help="rounds per block")
    parser.add_argument("--repetitions", type=int, default=4,
                        help="timed blocks per engine and dimension, after one warm-up block")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args()
    engines = list(dict.fromkeys(["threads"] + args.engines))  # threads is the baseline

    executors = Executors(args.dask_workers)
    rows = []
    try:
        for dim in args.dims:
            times = measure(dim, engines, executors, args)
            rows.append({"dim": dim, **{e: {**quartiles(times[e]), "rounds": len(times[e])}
                                        for e in engines}})
    finally:
        executors.close()

    print(f"optex.minimize round time, N = {args.parallelism}, quadratic gradient; "
          f"{machine_description()}; {args.dask_workers} local worker processes; "
          f"{args.repetitions} x {args.block} timed rounds per engine and d; {today()}")
    print()
    print(table(rows, engines))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"command": command_line(), "date": today(),
                       "machine": machine_description(), "parallelism": args.parallelism,
                       "workers": args.dask_workers, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
