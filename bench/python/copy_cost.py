"""What optex.minimize's copies of the objective's memory cost per round.

    python bench/python/copy_cost.py
    python bench/python/copy_cost.py --dims 100000 1000000 --json out.json

optex.minimize gives each evaluation a copy of its point (the objective may
keep its x: the engine rewrites its rows at the next ask()) and copies each
returned gradient on the worker the moment the objective returns (an objective
may reuse one buffer for every gradient). That is 2 N copies of d float32 per
round, O(N d), next to a round's own O(N T0 d) work (ask: N - 1 proxy steps
with the GP's predictions over T0 past gradients; tell).

Measured side by side in one process, on one engine per dimension: blocks of
``--block`` rounds with the copies ("copies") and with the copies replaced by
the identity ("no copies": the objective then receives the engine's row and
its gradient is read as returned, what minimize did before it copied),
alternating, the first block of each a warm-up. The objective is the cheapest
possible (the gradient of 0.5 ||x - 1||^2 in float32), on the threads executor,
so a round's time is the engine's work plus the copies. Reported per d: the
median and IQR of the round time in ms for both, the difference of the
medians, and the 2 N copies alone timed in a loop (median ms per round).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, Iterator

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from records import command_line, machine_description, quartiles, today  # noqa: E402

import optex  # noqa: E402
from optex import _evaluation, _rounds  # noqa: E402


def quadratic(x: np.ndarray) -> tuple[float, np.ndarray]:
    """0.5 ||x - 1||^2 and its gradient, float32."""
    g = x - np.float32(1.0)
    return 0.5 * float(np.dot(g, g)), g


class without_copies:
    """Within the block: the point is the engine's row, the gradient read as returned."""

    def __enter__(self) -> None:
        self.saved = (_rounds.objective_point, _evaluation.owned_gradient)
        _rounds.objective_point = lambda row: row
        _evaluation.owned_gradient = lambda grad: grad

    def __exit__(self, *exc: Any) -> None:
        _rounds.objective_point, _evaluation.owned_gradient = self.saved


def round_times(engine: optex.OptEx, rounds: int) -> list[float]:
    """ms between consecutive rounds' callbacks, the first from the call."""
    stamps = [time.perf_counter()]
    # max_iters bounds the engine's iteration count: `rounds` more of them.
    optex.minimize(quadratic, engine, max_iters=engine.iteration + rounds,
                   callback=lambda info: stamps.append(time.perf_counter()))
    return [1e3 * (b - a) for a, b in zip(stamps, stamps[1:])]


def copies_alone(dim: int, n: int, repeats: int) -> list[float]:
    """ms of one round's copies: N points and N float32 gradients of d entries."""
    rows = np.ones((n, dim), dtype=np.float32)
    grads = [np.ones(dim, dtype=np.float32) for _ in range(n)]
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(n):
            _evaluation.objective_point(rows[i])
            _evaluation.owned_gradient(grads[i])
        times.append(1e3 * (time.perf_counter() - start))
    return times


def alternating(labels: list[str], repetitions: int) -> Iterator[tuple[int, str]]:
    """(repetition, label) with the order rotated each repetition; repetition 0 warms up."""
    for repetition in range(repetitions + 1):
        shift = repetition % len(labels)
        for label in labels[shift:] + labels[:shift]:
            yield repetition, label


def measure(dim: int, args: argparse.Namespace) -> dict[str, Any]:
    engine = optex.OptEx(np.zeros(dim, dtype=np.float32), optex.Sgd(lr=0.05),
                         parallelism=args.parallelism, history=args.history, seed=0)
    times: dict[str, list[float]] = {"copies": [], "no copies": []}
    for repetition, label in alternating(list(times), args.repetitions):
        if label == "copies":
            block = round_times(engine, args.block)
        else:
            with without_copies():
                block = round_times(engine, args.block)
        if repetition > 0:
            times[label] += block
    row: dict[str, Any] = {"dim": dim}
    for label, values in times.items():
        row[label] = {**quartiles(values), "rounds": len(values)}
    row["copies alone"] = quartiles(copies_alone(dim, args.parallelism, 5 * args.block))
    return row


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| d | copies ms/round, median [IQR] | no copies ms/round, median [IQR] "
             "| difference of the medians, ms | the 2 N copies alone, ms |",
             "|---|---|---|---|---|"]
    for row in rows:
        cells = [f"{row['dim']:.0e}".replace("e+0", "e")]
        for label in ("copies", "no copies"):
            q = row[label]
            cells.append(f"{q['median']:.2f} [{q['q1']:.2f}, {q['q3']:.2f}]")
        cells.append(f"{row['copies']['median'] - row['no copies']['median']:+.2f}")
        cells.append(f"{row['copies alone']['median']:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[100_000, 300_000, 1_000_000])
    parser.add_argument("--parallelism", type=int, default=4)
    parser.add_argument("--history", type=int, default=32, help="T0")
    parser.add_argument("--block", type=int, default=20, help="rounds per block")
    parser.add_argument("--repetitions", type=int, default=4,
                        help="timed blocks per variant and dimension, after one warm-up block")
    parser.add_argument("--json", help="also write the numbers here")
    args = parser.parse_args()

    rows = [measure(dim, args) for dim in args.dims]
    print(f"optex.minimize round time with and without the copies of the objective's memory, "
          f"N = {args.parallelism}, T0 = {args.history}, threads, quadratic gradient; "
          f"{machine_description()}; {args.repetitions} x {args.block} timed rounds per "
          f"variant and d; {today()}")
    print()
    print(table(rows))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"command": command_line(), "date": today(),
                       "machine": machine_description(), "parallelism": args.parallelism,
                       "history": args.history, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
