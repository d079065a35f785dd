"""Options.threads from Python: the same trajectory bit for bit on 1, 2 and 3
threads (at a dimension where the passes really split), set_threads at any
time, hostile values refused without a change, and checkpoints that leave the
machine's thread count out."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
from conftest import float_hex, run_iterations

import optex
from optex import problems

DIM = 200_003  # about 50 coordinate blocks: every pass is worth several threads


def run(threads: int, switch_to: int | None = None) -> list[str]:
    f = problems.Rosenbrock()
    opt = optex.OptEx(f.standard_start(DIM), optimizer=optex.Adam(lr=1e-3), parallelism=4,
                      history=6, seed=3, threads=threads, trust_region=3.0)
    out = []
    for round_ in range(5):
        points = opt.ask()
        if switch_to is not None:
            opt.set_threads(switch_to if round_ % 2 else threads)
        losses, grads = f.value_and_grad(points)
        info = opt.tell(grads, losses)
        out.append(f"{float_hex(opt.x)}/{info.grad_norm!r}/{info.cosine!r}/{info.lengthscale!r}")
    return out


def test_every_thread_count_gives_the_same_bits() -> None:
    one = run(1)
    assert run(2) == one
    assert run(3) == one
    assert run(3, switch_to=1) == one


@pytest.mark.parametrize("bad", [-1, 1025, 2**40, 1.5, "2", None, np.nan])
def test_hostile_thread_counts_are_refused_and_change_nothing(bad) -> None:
    with pytest.raises((ValueError, TypeError)):
        optex.Options(threads=bad)
    opt = optex.OptEx(np.zeros(4, dtype=np.float32), threads=2)
    with pytest.raises((ValueError, TypeError)):
        opt.set_threads(bad)
    assert opt.options.threads == 2


def test_a_checkpoint_leaves_the_thread_count_out(tmp_path: pathlib.Path) -> None:
    f = problems.Rastrigin()
    opt = optex.OptEx(f.standard_start(12), parallelism=4, history=8, seed=5, threads=3)
    run_iterations(opt, f, 3)
    opt.save(tmp_path / "run.ckpt")
    restored = optex.OptEx.load(tmp_path / "run.ckpt")
    assert restored.options.threads == 0  # this machine's cores, whatever the saving one had
    restored.set_threads(3)
    assert restored.options == opt.options
    assert [float_hex(opt.x)] == [float_hex(restored.x)]


def test_the_torch_facade_takes_threads_and_ranks_need_not_agree_on_it() -> None:
    torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch)")
    from optex.torch import OptEx
    from optex.torch import hyperparameters

    model = torch.nn.Linear(3, 2)
    data = torch.ones(4, 3)
    opt = OptEx(model.parameters(), lr=1e-2, parallelism=2, threads=2)

    def closure():
        opt.zero_grad()
        loss = model(data).square().mean()
        loss.backward()
        return loss

    opt.step(closure)
    assert opt.engine.options.threads == 2
    with pytest.raises(ValueError, match="threads"):
        OptEx(model.parameters(), lr=1e-2, threads=-1)
    one = optex.Options(threads=1)
    many = optex.Options(threads=7)
    assert hyperparameters.options_key(one) == hyperparameters.options_key(many)
    assert hyperparameters.options_key(one) != hyperparameters.options_key(optex.Options(history=9))
