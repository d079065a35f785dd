"""optex.torch.OptEx with points evaluated several times (evaluations_per_point,
the adaptive strategy, a safeguard that cuts the chain): the closure runs once per
batch row, each row with its own seed, the trajectory is the ask/tell loop's, and
step returns the committed point's loss (the mean of its evaluations).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); "
                                             "not installed here")

import optex  # noqa: E402
from optex.torch import OptEx  # noqa: E402


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 1))


DATA = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
TARGET = torch.randn(32, 1, generator=torch.Generator().manual_seed(2))


def minibatch_loss(model: torch.nn.Module, seed: int) -> torch.Tensor:
    """The loss on 8 samples drawn with `seed`: a stochastic objective."""
    rows = torch.randperm(32, generator=torch.Generator().manual_seed(seed % 2**63))[:8]
    return ((model(DATA[rows]) - TARGET[rows]) ** 2).mean()


def flat(model: torch.nn.Module) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()]).numpy().copy()


def run_facade(steps: int, **options):
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.05, seed=4, **options)
    seen, returned = [], []

    def closure():
        opt.zero_grad()
        loss = minibatch_loss(model, opt.current_seed)
        loss.backward()
        seen.append((opt.current_point, opt.current_seed, flat(model), loss.item()))
        return loss

    for _ in range(steps):
        returned.append(opt.step(closure))
    return opt, model, seen, returned


def run_engine(steps: int, **options) -> optex.OptEx:
    """The same run through ask/tell on the flat vector."""
    model = make_model()
    params = list(model.parameters())
    engine = optex.OptEx(flat(model), optex.Adam(lr=0.05), seed=4, **options)
    sizes = [p.numel() for p in params]
    for _ in range(steps):
        points = engine.ask()
        grads = np.empty(points.shape, np.float32)
        losses = np.empty(len(points))
        for r, seed in enumerate(engine.seeds):
            with torch.no_grad():
                for p, piece in zip(params, torch.from_numpy(np.array(points[r])).split(sizes)):
                    p.copy_(piece.view(p.shape))
                    p.grad = None
            loss = minibatch_loss(model, int(seed))
            loss.backward()
            grads[r] = torch.cat([p.grad.reshape(-1) for p in params]).numpy()
            losses[r] = loss.item()
        engine.tell(grads, losses)
    return engine


@pytest.mark.parametrize(
    "options",
    [dict(parallelism=6, evaluations_per_point=3),
     dict(parallelism=4, evaluations_per_point=4),
     dict(parallelism=4, evaluations_per_point=2, continue_from="best_loss", trust_region=0.5),
     dict(options=optex.Options.adaptive(4))],
    ids=["D3", "one-point", "best-loss-trust-region", "adaptive"],
)
def test_step_equals_the_ask_tell_loop_bit_for_bit(options: dict) -> None:
    opt, model, _, returned = run_facade(6, **options)
    engine = run_engine(6, **options)
    assert flat(model).tobytes() == engine.x.tobytes()
    assert opt.engine.iteration == engine.iteration == 6
    assert opt.engine.evaluations == engine.evaluations
    assert all(isinstance(r, torch.Tensor) and r.dim() == 0 for r in returned)


def test_the_closure_runs_once_per_row_with_the_rows_seed() -> None:
    opt, _, seen, _ = run_facade(3, parallelism=6, evaluations_per_point=2)
    assert len(seen) == 3 * 6
    for step in range(3):
        rows = seen[step * 6:(step + 1) * 6]
        assert [r[0] for r in rows] == list(range(6))
        assert len({r[1] for r in rows}) == 6  # one seed per evaluation
        for point in range(3):  # the two rows of a point hold the same parameters
            first, second = rows[2 * point], rows[2 * point + 1]
            assert first[2].tobytes() == second[2].tobytes()


def test_step_returns_the_mean_loss_of_the_committed_point() -> None:
    opt, _, seen, returned = run_facade(4, parallelism=6, evaluations_per_point=3)
    info = opt.last_info
    assert info.point_evaluations == [3, 3]
    last_rows = [loss for _, _, _, loss in seen[-6:]]
    first = 3 * info.committed_point
    # The engine's mean of the float64 losses of the committed point's rows.
    assert info.loss == pytest.approx(sum(last_rows[first:first + 3]) / 3, rel=1e-15)
    assert returned[-1].item() == pytest.approx(info.loss, rel=1e-6)
    assert returned[-1].dtype == torch.float32


def test_a_point_with_one_evaluation_returns_the_closures_own_loss() -> None:
    """D = 1 and the best loss: step returns the loss the closure returned for the
    committed row (a detached copy of that tensor, taken when it was returned),
    wherever the commit steps from."""
    model = make_model()
    opt = OptEx(model.parameters(), lr=0.5, parallelism=4, continue_from="best_loss", seed=1)
    results = []

    def closure():
        opt.zero_grad()
        loss = minibatch_loss(model, opt.current_seed)
        loss.backward()
        results.append(loss)
        return loss

    for _ in range(6):
        results.clear()
        returned = opt.step(closure)
        own = results[opt.last_info.committed_point]
        assert returned is not own and not returned.requires_grad
        assert returned.dtype == own.dtype and returned.item() == own.item()
        assert returned.item() == opt.last_info.loss
