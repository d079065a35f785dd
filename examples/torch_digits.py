"""A small CNN on scikit-learn's digits: optex.torch.OptEx next to torch.optim.Adam.

    python examples/torch_digits.py            # target 97% test accuracy, seeds 0, 1, 2
    python examples/torch_digits.py --quick    # target 90%, one seed: about ten seconds

Data: ``sklearn.datasets.load_digits`` (1797 8x8 images, bundled with
scikit-learn, no download), pixels scaled to [0, 1], split once (stratified,
fixed split seed) into 1297 training and 500 test images.

Three ways to train the same CNN, each from ``torch.manual_seed(seed)`` (which
also seeds OptEx's run, and with it PointBatches' epochs, and the DataLoader's
shuffling), until the test accuracy (measured after every round, outside the
timing) reaches the target:

- OptEx, N = 4, Adam at lr 1e-3: each round evaluates 4 points, each on its own
  minibatch of 32 (``optex.torch.PointBatches``);
- ``torch.optim.Adam``, lr 1e-3, minibatches of 32 (one per step);
- ``torch.optim.Adam``, lr 1e-3, minibatches of 4 x 32: the same samples per
  round as OptEx, spent on one step.

It prints, per method, the medians over the seeds of the rounds (steps) to the
target, the gradient rows and samples they evaluated, and the wall-clock of the
training steps. Here the 4 rows of an OptEx round run one after another in one
process, so its wall-clock counts 4 gradient evaluations per round plus the
engine's work; with the rows on 4 workers (torch.distributed) a round would
cost about one evaluation plus the engine's work.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import optex.torch

TEST_SIZE = 500
SPLIT_SEED = 0
LR = 1e-3
N = 4
BATCH = 32


@dataclass(frozen=True)
class Digits:
    x_train: torch.Tensor  # (1297, 1, 8, 8) float32 in [0, 1]
    y_train: torch.Tensor  # (1297,) int64
    x_test: torch.Tensor
    y_test: torch.Tensor


def load() -> Digits:
    data = load_digits()
    x_train, x_test, y_train, y_test = train_test_split(
        data.data / 16.0, data.target, test_size=TEST_SIZE, stratify=data.target, random_state=SPLIT_SEED
    )

    def images(x):
        return torch.tensor(x, dtype=torch.float32).reshape(-1, 1, 8, 8)

    return Digits(images(x_train), torch.tensor(y_train), images(x_test), torch.tensor(y_test))


def make_cnn() -> torch.nn.Module:
    """Two 3x3 convolutions with pooling and a linear layer: 6,090 parameters."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(32 * 2 * 2, 10),
    )


def accuracy(model: torch.nn.Module, data: Digits) -> float:
    with torch.no_grad():
        return (model(data.x_test).argmax(dim=1) == data.y_test).float().mean().item()


def loss_fn(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits, labels)


def sequential_closure(model, loss_fn, batches):
    """The closure that step calls at each of a round's points, one after another."""
    def closure():
        model.zero_grad()
        inputs, labels = batches()  # this evaluation's own minibatch
        loss = loss_fn(model(inputs), labels)
        loss.backward()
        return loss
    return closure


def optex_rounds(model: torch.nn.Module, data: Digits) -> Callable[[], None]:
    """One OptEx round per call."""
    opt = optex.torch.OptEx(model.parameters(), optimizer="adam", lr=LR, parallelism=N)  # lr 1e-3, N = 4
    batches = optex.torch.PointBatches(opt, (data.x_train, data.y_train), batch_size=BATCH)  # 32
    # optex_batched_rounds below evaluates the N points in one call instead.
    closure = sequential_closure(model, loss_fn, batches)

    def one_round() -> None:
        opt.step(closure)  # one round: the closure runs at the 4 points, each on its own batch
    return one_round


def optex_batched_rounds(model: torch.nn.Module, data: Digits) -> Callable[[], None]:
    """One OptEx round per call, its N evaluations in one vectorized call (torch.func)."""
    opt = optex.torch.OptEx(model.parameters(), optimizer="adam", lr=LR, parallelism=N)
    batches = optex.torch.PointBatches(opt, (data.x_train, data.y_train), batch_size=BATCH)
    closure = optex.torch.BatchedClosure(model, lambda m, inputs, labels: loss_fn(m(inputs), labels), batches)

    def one_round() -> None:
        opt.step(closure)
    return one_round


def adam_steps(batch_size: int) -> Callable[[torch.nn.Module, Digits], Callable[[], None]]:
    """One torch.optim.Adam step per call, on the batches of a shuffling DataLoader."""
    def start(model: torch.nn.Module, data: Digits) -> Callable[[], None]:
        opt = torch.optim.Adam(model.parameters(), lr=LR)
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data.x_train, data.y_train),
                                             batch_size=batch_size, shuffle=True, drop_last=True)
        epochs = itertools.chain.from_iterable(itertools.repeat(loader))  # reshuffled each pass

        def step() -> None:
            inputs, labels = next(epochs)
            opt.zero_grad()
            loss = loss_fn(model(inputs), labels)
            loss.backward()
            opt.step()
        return step
    return start


@dataclass(frozen=True)
class Method:
    name: str
    rows_per_round: int
    batch_size: int
    # Sets the optimizer up (outside the timing: torch's first optimizer imports
    # torch._dynamo, seconds) and returns one round.
    start: Callable[[torch.nn.Module, Digits], Callable[[], None]]


METHODS = (
    Method(f"OptEx N={N}, Adam", N, BATCH, optex_rounds),
    Method(f"OptEx N={N}, batched", N, BATCH, optex_batched_rounds),
    Method("Adam", 1, BATCH, adam_steps(BATCH)),
    Method(f"Adam, {N}x batch", 1, N * BATCH, adam_steps(N * BATCH)),
)


@dataclass(frozen=True)
class Run:
    rounds: int | None  # None: the target was not reached within the rounds allowed
    seconds: float  # in the training steps, the accuracy checks left out


def run(method: Method, data: Digits, seed: int, target: float, max_rounds: int) -> Run:
    torch.manual_seed(seed)
    model = make_cnn()
    seconds = 0.0
    one_round = method.start(model, data)
    for r in range(1, max_rounds + 1):
        start = time.perf_counter()
        one_round()
        seconds += time.perf_counter() - start
        if accuracy(model, data) >= target:
            return Run(r, seconds)
    return Run(None, seconds)


def median_rounds(runs: list[Run]) -> float | None:
    """The median, an unreached target counting as infinitely many rounds."""
    value = statistics.median(r.rounds if r.rounds is not None else float("inf") for r in runs)
    return None if value == float("inf") else value


def table(results: dict[str, list[Run]], data: Digits, target: float, seeds: list[int]) -> str:
    parameters = sum(p.numel() for p in make_cnn().parameters())
    lines = [
        f"digits CNN ({parameters:,} parameters), {len(data.y_train)} training / {len(data.y_test)} "
        f"test images, target test accuracy {target:.0%}, medians over seeds {', '.join(map(str, seeds))}",
        f"{'method':<20} {'rows x batch':>12} {'rounds':>7} {'gradient rows':>14} "
        f"{'samples':>8} {'wall-clock s':>13}",
    ]
    for method in METHODS:
        runs = results[method.name]
        rounds = median_rounds(runs)
        seconds = statistics.median(r.seconds for r in runs)
        shape = f"{method.rows_per_round} x {method.batch_size}"
        if rounds is None:
            lines.append(f"{method.name:<20} {shape:>12} {'not reached':>7} {'-':>14} {'-':>8} {seconds:>13.2f}")
            continue
        rows = rounds * method.rows_per_round
        lines.append(f"{method.name:<20} {shape:>12} {rounds:>7g} {rows:>14g} "
                     f"{rows * method.batch_size:>8g} {seconds:>13.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="target 90%%, one seed, at most 400 rounds")
    parser.add_argument("--target", type=float, help="test accuracy to reach (default 0.97, 0.90 with --quick)")
    parser.add_argument("--seeds", type=int, help="seeds 0 .. S-1 (default 3, 1 with --quick)")
    parser.add_argument("--max-rounds", type=int, help="rounds allowed per run (default 3000, 400 with --quick)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    if args.target is not None and not 0.0 < args.target <= 1.0:
        parser.error(f"--target: a test accuracy in (0, 1], got {args.target}")
    for name in ("seeds", "max_rounds", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')}: must be at least 1, got {value}")
    target = args.target if args.target is not None else (0.90 if args.quick else 0.97)
    seeds = list(range(args.seeds if args.seeds is not None else (1 if args.quick else 3)))
    max_rounds = args.max_rounds if args.max_rounds is not None else (400 if args.quick else 3000)
    torch.set_num_threads(args.threads)

    data = load()
    results = {m.name: [run(m, data, seed, target, max_rounds) for seed in seeds] for m in METHODS}
    print(table(results, data, target, seeds))


if __name__ == "__main__":
    main()
