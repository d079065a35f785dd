"""optex.torch.BatchedClosure: a round's evaluations in one vectorized call.

The batched step must follow the trajectory of the ordinary closure that people
write (one evaluation at a time, the LBFGS protocol), refuse what vmap cannot run
before anything changes, and hand non-finite values to the engine as step does.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from conftest import require_torch_cuda  # noqa: E402
from optex.torch import BatchedClosure, OptEx  # noqa: E402
from optex.torch.layout import FlatLayout  # noqa: E402

N = 4
ROUNDS = 5
# Batched against sequential: vmap computes the rows with batched kernels (batched
# matrix products, grouped convolutions) that may add in another order than the
# per-row kernels, so gradients differ by float32 rounding (about 1e-7 relative).
# Adam divides each gradient component by its running RMS, so on components whose
# gradient is near zero that rounding becomes an absolute difference of a small
# fraction of lr per step; over ROUNDS rounds at lr 0.05 the parameters stay within
# 1e-4 (measured: at most 1.5e-5), while the trajectories move by about 1e-1.
ATOL = RTOL = 1e-4
MOVED = 100 * ATOL


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def cnn() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Unflatten(1, (1, 6, 6)), torch.nn.Conv2d(1, 4, 3), torch.nn.ReLU(),
        torch.nn.Conv2d(4, 6, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(6, 3),
    )


MODELS = {"mlp": (mlp, 6), "cnn": (cnn, 36)}


def cross_entropy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(model(x), y)


class RowData:
    """One fixed minibatch per evaluation row (x: (rows, batch, features)); records
    every batches_for call."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor) -> None:
        self.x, self.y = x, y
        self.asked: list[list[int]] = []

    def batches_for(self, rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        self.asked.append(list(rows))
        return self.x[rows], self.y[rows]

    def row(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]


def row_data(features: int, rows: int = N, batch: int = 16, seed: int = 3) -> RowData:
    g = torch.Generator().manual_seed(seed)
    return RowData(torch.randn(rows, batch, features, generator=g), torch.randint(0, 3, (rows, batch), generator=g))


def shared_data(features: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = row_data(features, rows=1, seed=4)
    return data.x[0], data.y[0]


def sequential_closure(opt: OptEx, model: torch.nn.Module, data, loss_fn=cross_entropy):
    """The closure as people write it: one evaluation, the minibatch of opt.current_point."""

    def closure():
        opt.zero_grad()
        x, y = data if isinstance(data, tuple) else data.row(opt.current_point)
        loss = loss_fn(model, x, y)
        loss.backward()
        return loss

    return closure


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).to(torch.float32) for p in model.parameters()])


def run(model: torch.nn.Module, data, batched: bool, rounds: int = ROUNDS, params=None, loss_fn=cross_entropy,
        **options):
    """Trains with OptEx; returns (parameters after each round, the returned losses, the optimizer)."""
    options = {"lr": 0.05, "parallelism": N, "seed": 2, **options}
    opt = OptEx(model.parameters() if params is None else params, **options)
    closure = BatchedClosure(model, loss_fn, data) if batched else sequential_closure(opt, model, data, loss_fn)
    trajectory, losses = [], []
    for _ in range(rounds):
        losses.append(opt.step(closure))
        trajectory.append(flat(model))
    return trajectory, losses, opt


def assert_same_trajectory(batched, sequential) -> None:
    (xs, losses, _), (ys, reference_losses, _) = batched, sequential
    for t, (x, y) in enumerate(zip(xs, ys)):
        torch.testing.assert_close(x, y, atol=ATOL, rtol=RTOL, msg=f"round {t + 1}")
    for loss, reference in zip(losses, reference_losses):
        assert isinstance(loss, torch.Tensor) and loss.ndim == 0
        assert loss.item() == pytest.approx(reference.item(), rel=RTOL, abs=ATOL)


def unchanged(opt: OptEx, model: torch.nn.Module) -> tuple:
    """What a refused step must leave as it was: the parameters, the engine's iteration, pending."""
    return flat(model).numpy().tobytes(), opt.engine.iteration, opt.engine.pending


# ---------------------------------------------------------------------------- the trajectory


@pytest.mark.parametrize("optimizer", [dict(optimizer="adam"), dict(optimizer="sgd", momentum=0.9)],
                         ids=["adam", "sgd-momentum"])
@pytest.mark.parametrize("per_row", [False, True], ids=["shared-data", "per-row-data"])
@pytest.mark.parametrize("name", list(MODELS))
def test_the_batched_step_follows_the_sequential_closures_trajectory(name, per_row, optimizer) -> None:
    make, features = MODELS[name]
    data = row_data(features) if per_row else shared_data(features)
    batched = run(make(), data, batched=True, **optimizer)
    sequential = run(make(), data, batched=False, **optimizer)
    assert_same_trajectory(batched, sequential)
    assert (batched[0][-1] - flat(make())).abs().max() > MOVED
    if per_row:
        # One call per round, for all N rows.
        assert data.asked == [list(range(N))] * ROUNDS


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_on_cuda_tensors_the_batched_step_follows_the_sequential_closures_trajectory(name) -> None:
    # The round a GPU user runs: model, data and engine on the GPU, the N rows in one
    # vectorized call, against the ordinary closure on the same GPU.
    require_torch_cuda(optex_build=True)
    make, features = MODELS[name]
    host = row_data(features)
    data = RowData(host.x.cuda(), host.y.cuda())
    batched = run(make().cuda(), data, batched=True)
    sequential = run(make().cuda(), RowData(data.x, data.y), batched=False)
    assert_same_trajectory(batched, sequential)
    opt = batched[2]
    assert opt.engine.options.device == f"cuda:{torch.cuda.current_device()}"
    assert batched[0][-1].device.type == "cuda"
    assert (batched[0][-1] - flat(make().cuda())).abs().max() > MOVED
    assert data.asked == [list(range(N))] * ROUNDS


def test_evaluations_per_point_two() -> None:
    data = row_data(6)
    batched = run(mlp(), data, batched=True, evaluations_per_point=2)
    sequential = run(mlp(), data, batched=False, evaluations_per_point=2)
    assert_same_trajectory(batched, sequential)
    opt = batched[2]
    assert opt.last_info.point_evaluations == [2, 2]
    # With several evaluations a point's loss is the mean of its rows'.
    assert batched[1][-1].item() == pytest.approx(opt.last_info.loss, rel=1e-6)


def test_vectorize_false_is_the_sequential_closure_bit_for_bit() -> None:
    data = row_data(36)
    model = cnn()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=2)
    closure = BatchedClosure(model, cross_entropy, data, vectorize=False)
    losses = [opt.step(closure).item() for _ in range(ROUNDS)]
    xs, reference_losses, _ = run(cnn(), data, batched=False)
    assert flat(model).numpy().tobytes() == xs[-1].numpy().tobytes()
    assert losses == [loss.item() for loss in reference_losses]
    assert data.asked == [[i] for _ in range(ROUNDS) for i in range(N)]


@pytest.mark.parametrize("name", list(MODELS))
def test_each_gradient_row_is_that_rows_own_gradient(name) -> None:
    make, features = MODELS[name]
    model, data = make(), row_data(features)
    layout = FlatLayout([list(model.parameters())])
    g = torch.Generator().manual_seed(9)
    points = layout.flatten() + 0.1 * torch.randn(N, layout.dim, generator=g)
    grads = torch.full((N, layout.dim), float("nan"))
    losses = torch.full((N,), float("nan"), dtype=torch.float64)
    results = BatchedClosure(model, cross_entropy, data).evaluate_rows(layout, points, range(N), grads, losses)

    for i in range(N):
        reference = make()
        torch.nn.utils.vector_to_parameters(points[i], reference.parameters())
        loss = cross_entropy(reference, *data.row(i))
        loss.backward()
        expected = torch.cat([p.grad.reshape(-1) for p in reference.parameters()])
        torch.testing.assert_close(grads[i], expected, atol=1e-6, rtol=1e-5)
        assert losses[i].item() == pytest.approx(loss.item(), rel=1e-6)
        assert results[i].item() == pytest.approx(loss.item(), rel=1e-6)
    assert all(p.grad is None for p in model.parameters())  # the model's own .grad is not touched


def test_rows_of_a_distributed_share_go_to_the_first_rows_of_the_buffers() -> None:
    model, data = mlp(), row_data(6)
    layout = FlatLayout([list(model.parameters())])
    points = layout.flatten() + 0.1 * torch.randn(N, layout.dim, generator=torch.Generator().manual_seed(9))
    full_grads, full_losses = torch.empty(N, layout.dim), torch.empty(N, dtype=torch.float64)
    BatchedClosure(model, cross_entropy, data).evaluate_rows(layout, points, range(N), full_grads, full_losses)
    grads, losses = torch.zeros(3, layout.dim), torch.zeros(3, dtype=torch.float64)
    results = BatchedClosure(model, cross_entropy, data).evaluate_rows(layout, points[2:4], range(2, 4), grads, losses)
    assert sorted(results) == [2, 3] and data.asked[-1] == [2, 3]
    torch.testing.assert_close(grads[:2], full_grads[2:], atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(losses[:2], full_losses[2:], atol=1e-6, rtol=1e-6)
    assert torch.equal(grads[2], torch.zeros(layout.dim)) and losses[2] == 0.0


def test_parameters_outside_the_optimizer_keep_the_models_values() -> None:
    data = row_data(6)
    models = [mlp(), mlp()]
    first_layer = flat(models[0])[:56].clone()
    batched = run(models[0], data, batched=True, params=models[0][2].parameters())
    sequential = run(models[1], data, batched=False, params=models[1][2].parameters())
    assert_same_trajectory(batched, sequential)
    assert torch.equal(flat(models[0])[:56], first_layer)
    assert (flat(models[0])[56:] - flat(mlp())[56:]).abs().max() > MOVED


def test_a_frozen_parameter_gets_a_zero_gradient_as_in_the_sequential_closure() -> None:
    def frozen_bias() -> torch.nn.Module:
        model = mlp()
        model[0].bias.requires_grad_(False)
        return model

    data = row_data(6)
    models = [frozen_bias(), frozen_bias()]
    batched = run(models[0], data, batched=True)
    sequential = run(models[1], data, batched=False)
    assert_same_trajectory(batched, sequential)
    assert torch.equal(models[0][0].bias, mlp()[0].bias)  # Adam without weight decay: a zero gradient stays


def test_tied_parameters_are_one_parameter() -> None:
    class Tied(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.encode = torch.nn.Linear(6, 6)
            self.decode = torch.nn.Linear(6, 6)
            self.decode.weight = self.encode.weight

        def forward(self, x):
            return self.decode(torch.tanh(self.encode(x)))

    def loss_fn(model, x, y):
        return ((model(x) - x) ** 2).mean() + 0 * y.sum()

    data = row_data(6)
    batched = run(Tied(), data, batched=True, loss_fn=loss_fn)
    sequential = run(Tied(), data, batched=False, loss_fn=loss_fn)
    assert_same_trajectory(batched, sequential)


# ---------------------------------------------------------------------------- randomness


def dropout_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Dropout(0.5), torch.nn.Linear(8, 1, bias=False))


def mean_output(model, x):
    return model(x).mean()


def gradient_rows(closure: BatchedClosure) -> torch.Tensor:
    """The gradients of N rows that all hold the model's own point."""
    layout = FlatLayout([list(closure.model.parameters())])
    points = layout.flatten().repeat(N, 1)
    grads = torch.empty(N, layout.dim)
    closure.evaluate_rows(layout, points, range(N), grads, torch.empty(N, dtype=torch.float64))
    return grads


# With one example of ones, the gradient of the output is the dropout mask scaled by
# 1 / (1 - p) = 2: each row's gradient shows the mask it drew.
ONE_EXAMPLE = (torch.ones(1, 8),)


def test_randomness_different_draws_a_dropout_mask_per_row() -> None:
    model = dropout_model()
    torch.manual_seed(1)
    grads = gradient_rows(BatchedClosure(model, mean_output, ONE_EXAMPLE))
    assert set(torch.unique(grads).tolist()) == {0.0, 2.0}
    assert len({tuple(row.tolist()) for row in grads}) == N


def test_randomness_same_draws_one_mask_for_all_rows() -> None:
    model = dropout_model()
    torch.manual_seed(1)
    grads = gradient_rows(BatchedClosure(model, mean_output, ONE_EXAMPLE, randomness="same"))
    assert set(torch.unique(grads).tolist()) == {0.0, 2.0}
    assert all(torch.equal(row, grads[0]) for row in grads)


def test_randomness_error_refuses_dropout_and_changes_nothing() -> None:
    model = dropout_model()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=N)
    data = (torch.ones(4, 8),)
    opt.step(sequential_closure(opt, model, (data[0], None), lambda m, x, y: mean_output(m, x)))
    before = unchanged(opt, model)
    with pytest.raises(ValueError, match=r"randomness='error' refuses random operations.*'different'"):
        opt.step(BatchedClosure(model, mean_output, data, randomness="error"))
    assert unchanged(opt, model) == (before[0], before[1], True)
    model.eval()  # no dropout: nothing random to refuse
    opt.step(BatchedClosure(model, mean_output, data, randomness="error"))
    assert opt.engine.iteration == 2 and not opt.engine.pending


def test_the_same_seed_gives_the_same_trajectory() -> None:
    def trajectory(seed: int) -> bytes:
        model = dropout_model()
        torch.manual_seed(seed)
        opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=2)
        closure = BatchedClosure(model, mean_output, (torch.randn(4, 8, generator=torch.Generator().manual_seed(5)),))
        for _ in range(ROUNDS):
            opt.step(closure)
        return flat(model).numpy().tobytes()

    assert trajectory(7) == trajectory(7)
    assert trajectory(7) != trajectory(8)  # the draws do depend on the seed


# ---------------------------------------------------------------------------- models vmap cannot run


class WithBatchNorm(torch.nn.Module):
    def __init__(self, **batchnorm) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(1, 2, 3)
        self.bn1 = torch.nn.BatchNorm2d(2, **batchnorm)
        self.head = torch.nn.Linear(2 * 4 * 4, 3)

    def forward(self, x):
        return self.head(torch.relu(self.bn1(self.conv(x.view(-1, 1, 6, 6)))).flatten(1))


def test_batchnorm_updating_running_statistics_is_refused_at_construction() -> None:
    with pytest.raises(ValueError, match=r"model\.bn1 \(BatchNorm2d\) updates its running statistics in "
                                         r"place in training mode.*vectorize=False"):
        BatchedClosure(WithBatchNorm(), cross_entropy, row_data(36))
    BatchedClosure(WithBatchNorm(), cross_entropy, row_data(36), vectorize=False)
    BatchedClosure(WithBatchNorm().eval(), cross_entropy, row_data(36))
    with pytest.raises(ValueError, match=r"^BatchedClosure: model \(BatchNorm1d\)"):
        BatchedClosure(torch.nn.BatchNorm1d(3), cross_entropy, row_data(3))


def test_batchnorm_with_batch_statistics_only_follows_the_sequential_trajectory() -> None:
    # SGD: the normalisation cancels the conv bias's gradient (it is rounding noise
    # around zero), which Adam's first steps would scale up to +-lr.
    data = row_data(36)
    batched = run(WithBatchNorm(track_running_stats=False), data, batched=True, optimizer="sgd", momentum=0.9)
    sequential = run(WithBatchNorm(track_running_stats=False), data, batched=False, optimizer="sgd", momentum=0.9)
    assert_same_trajectory(batched, sequential)


def test_batchnorm_switched_to_training_mode_is_refused_at_the_step_and_changes_nothing() -> None:
    data = row_data(36)
    model = WithBatchNorm().eval()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=2)
    closure = BatchedClosure(model, cross_entropy, data)
    opt.step(closure)
    model.train()
    statistics = model.bn1.running_mean.clone()
    before = unchanged(opt, model)
    with pytest.raises(ValueError, match=r"model\.bn1 \(BatchNorm2d\)"):
        opt.step(closure)
    assert unchanged(opt, model) == (before[0], before[1], True)
    assert torch.equal(model.bn1.running_mean, statistics)
    opt.step(BatchedClosure(model, cross_entropy, data, vectorize=False))  # finishes the pending round
    assert opt.engine.iteration == 2 and not opt.engine.pending


def test_what_vmap_refuses_is_a_value_error_and_the_round_stays_pending() -> None:
    def item_loss(model, x, y):
        loss = cross_entropy(model, x, y)
        return loss if loss.item() > 0 else -loss  # data-dependent control flow

    data = row_data(6)
    model = mlp()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=2)
    opt.step(sequential_closure(opt, model, data))
    before = unchanged(opt, model)
    with pytest.raises(ValueError, match=r"torch\.func\.vmap could not evaluate loss_fn.*vectorize=False") as error:
        opt.step(BatchedClosure(model, item_loss, data))
    assert isinstance(error.value.__cause__, RuntimeError)
    assert unchanged(opt, model) == (before[0], before[1], True)
    # The sequential form evaluates the same pending round: the trajectory is the sequential one.
    for _ in range(ROUNDS - 1):
        opt.step(BatchedClosure(model, item_loss, data, vectorize=False))
    xs, _, _ = run(mlp(), data, batched=False)
    assert flat(model).numpy().tobytes() == xs[-1].numpy().tobytes()


def test_an_optimizer_parameter_that_is_not_the_models_is_refused() -> None:
    model, data = mlp(), row_data(6)
    extra = torch.nn.Parameter(torch.zeros(2, 5))
    opt = OptEx([*model.parameters(), extra], lr=0.05, parallelism=N)
    before = flat(model).numpy().tobytes()
    with pytest.raises(ValueError, match=r"parameter 4 of the optimizer .*shape \(2, 5\).* is not a parameter "
                                         r"of the model"):
        opt.step(BatchedClosure(model, cross_entropy, data))
    assert flat(model).numpy().tobytes() == before
    assert torch.equal(extra, torch.zeros(2, 5)) and opt.engine.pending


# ---------------------------------------------------------------------------- hostile inputs


def refused_step(closure_of, match: str) -> None:
    """A step with the closure made by ``closure_of(model)`` raises ValueError matching
    ``match`` after one good round, and changes nothing."""
    model, data = mlp(), row_data(6)
    opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=2)
    opt.step(BatchedClosure(model, cross_entropy, data))
    before = unchanged(opt, model)
    with pytest.raises(ValueError, match=match):
        opt.step(closure_of(model))
    assert unchanged(opt, model) == (before[0], before[1], True)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize(("loss_fn", "match"), [
    (lambda m, x, y: torch.nn.functional.cross_entropy(m(x), y, reduction="none"),
     r"loss_fn: must return a scalar loss, got a tensor of shape \(16,\)"),
    (lambda m, x, y: 1.5, r"loss_fn: must return the loss as a tensor with one element, got float"),
    (lambda m, x, y: None, r"got NoneType"),
    (lambda m, x, y: torch.ones(()), r"loss does not depend on the optimizer's parameters"),
], ids=["per-example", "float", "none", "constant"])
def test_a_loss_fn_that_returns_no_scalar_loss_is_refused(loss_fn, match) -> None:
    refused_step(lambda model: BatchedClosure(model, loss_fn, row_data(6)), match)


def test_a_one_element_loss_is_a_scalar_loss() -> None:
    data = row_data(6)
    xs, _, _ = run(mlp(), data, batched=True, loss_fn=lambda m, x, y: cross_entropy(m, x, y).reshape(1, 1))
    reference, _, _ = run(mlp(), data, batched=True)
    assert xs[-1].numpy().tobytes() == reference[-1].numpy().tobytes()


class BadRows:
    def __init__(self, result) -> None:
        self.result = result

    def batches_for(self, rows):
        return self.result(rows)


@pytest.mark.parametrize(("result", "match"), [
    (lambda rows: (torch.zeros(len(rows) - 1, 16, 6), torch.zeros(len(rows) - 1, 16, dtype=torch.long)),
     r"batches_for\(\.\.\.\)\[0\]: has shape \(3, 16, 6\), but its leading dimension must be the number of "
     r"rows asked for, 4"),
    (lambda rows: (torch.zeros(len(rows), 16, 6), torch.zeros(len(rows) + 1, 16, dtype=torch.long)),
     r"\[1\]: has shape \(5, 16\)"),
    (lambda rows: (torch.zeros(len(rows), 16, 6), torch.tensor(3)), r"\[1\]: has shape \(\)"),
    (lambda rows: torch.zeros(len(rows), 16, 6), r"must return a tuple of tensors, got Tensor"),
    (lambda rows: (torch.zeros(len(rows), 16, 6), [1, 2, 3, 4]), r"\[1\]: must be a tensor, got list"),
], ids=["too-few-rows", "too-many-rows", "zero-dim", "not-a-tuple", "not-a-tensor"])
def test_per_row_data_of_the_wrong_shape_or_type_is_refused(result, match) -> None:
    refused_step(lambda model: BatchedClosure(model, cross_entropy, BadRows(result)), match)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 3e38], ids=["nan", "inf", "huge"])
def test_a_row_with_non_finite_or_huge_values_follows_the_drop_nonfinite_rule(value) -> None:
    data = row_data(6)
    data.x[1, 0, 0] = value  # in row 1's minibatch
    refusals = []
    for batched in (True, False):
        model = mlp()
        opt = OptEx(model.parameters(), lr=0.05, parallelism=N, seed=2)
        closure = BatchedClosure(model, cross_entropy, data) if batched else sequential_closure(opt, model, data)
        try:
            opt.step(closure)
            refusals.append(None)
        except ValueError as error:
            refusals.append(str(error))
            assert flat(model).numpy().tobytes() == flat(mlp()).numpy().tobytes() and opt.engine.pending
    # The same refusal (NaN's sign may differ, which the message shows as -nan).
    batched_refusal, sequential_refusal = (r if r is None else r.replace("-nan", "nan") for r in refusals)
    assert batched_refusal == sequential_refusal
    batched = run(mlp(), data, batched=True, drop_nonfinite=True)
    sequential = run(mlp(), data, batched=False, drop_nonfinite=True)
    assert batched[2].last_info.dropped == sequential[2].last_info.dropped
    assert_same_trajectory(batched, sequential)
    assert all(torch.isfinite(x).all() for x in batched[0])
    if not np.isfinite(value):
        assert refusals[0] is not None and "finite" in refusals[0]
        assert batched[2].last_info.dropped == 1


@pytest.mark.parametrize(("args", "kwargs", "match"), [
    ((lambda x: x, cross_entropy, ()), {}, r"model: must be a torch.nn.Module, got function"),
    ((None, cross_entropy, ()), {}, r"model: must be a torch.nn.Module, got NoneType"),
    ((mlp(), 3, ()), {}, r"loss_fn: must be callable"),
    ((mlp(), cross_entropy, {"x": torch.zeros(2)}), {}, r"data: must be a tuple of tensors .* got dict"),
    ((mlp(), cross_entropy, torch.zeros(2, 6)), {}, r"data: must be a tuple of tensors .* got Tensor"),
    ((mlp(), cross_entropy, (torch.zeros(2, 6), [0, 1])), {}, r"data\[1\]: must be a tensor, got list"),
    ((mlp(), cross_entropy, ()), {"randomness": "sometimes"}, r"randomness: must be one of 'different', "
                                                              r"'same', 'error', got 'sometimes'"),
    ((mlp(), cross_entropy, ()), {"vectorize": 1}, r"vectorize: must be a bool, got 1"),
])
def test_wrong_arguments_are_refused_at_construction(args, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        BatchedClosure(*args, **kwargs)


def test_properties_are_the_arguments() -> None:
    model, data = mlp(), row_data(6)
    closure = BatchedClosure(model, cross_entropy, data, randomness="same", vectorize=False)
    assert (closure.model, closure.loss_fn, closure.data, closure.randomness, closure.vectorize) == \
        (model, cross_entropy, data, "same", False)
    shared = [torch.zeros(2, 6), torch.zeros(2, dtype=torch.long)]
    assert BatchedClosure(model, cross_entropy, shared).data == tuple(shared)  # a list is taken as a tuple


# ---------------------------------------------------------------------------- the ordinary closure


def test_called_directly_it_is_an_ordinary_closure() -> None:
    model = mlp()
    data = shared_data(6)
    loss = BatchedClosure(model, cross_entropy, data)()
    reference = mlp()
    expected = cross_entropy(reference, *data)
    expected.backward()
    assert loss.item() == expected.item()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert torch.equal(p.grad, q.grad)


def test_with_per_row_data_it_needs_the_row_of_a_step() -> None:
    model, data = mlp(), row_data(6)
    closure = BatchedClosure(model, cross_entropy, data, vectorize=False)
    with pytest.raises(ValueError, match=r"per-row data needs the evaluation row.*current_point"):
        closure()
    opt = OptEx(model.parameters(), lr=0.05, parallelism=N)
    opt.step(closure)
    with pytest.raises(ValueError, match="per-row data needs the evaluation row"):
        closure()  # after the step there is no current row either
    assert data.asked == [[0], [1], [2], [3]]


# ---------------------------------------------------------------------------- torch.distributed

DISTRIBUTED_N = 3  # rank 0 evaluates rows 0 and 1, rank 1 row 2


def _distributed_worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        model, data = mlp(), row_data(6, rows=DISTRIBUTED_N)
        opt = OptEx(model.parameters(), lr=0.05, parallelism=DISTRIBUTED_N, seed=2)
        closure = BatchedClosure(model, cross_entropy, data)
        losses = [opt.step(closure).item() for _ in range(2)]

        def fails_on_rank_1(m, x, y):
            if rank == 1:
                raise OSError("rank 1 lost its data")
            return cross_entropy(m, x, y)

        failure = ""
        try:
            opt.step(BatchedClosure(model, fails_on_rank_1, data))
        except RuntimeError as error:
            failure = str(error)
        losses += [opt.step(closure).item() for _ in range(2)]
        torch.save({"x": flat(model), "losses": losses, "asked": data.asked, "failure": failure},
                   os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def test_under_torch_distributed_each_rank_evaluates_its_rows(tmp_path: Path, monkeypatch) -> None:
    import torch.distributed as dist
    import torch.multiprocessing as mp

    if not (dist.is_available() and dist.is_gloo_available()):
        pytest.skip("this torch has no torch.distributed with the gloo backend")
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_distributed_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=True) for r in range(2)]

    single, losses, _ = run(mlp(), row_data(6, rows=DISTRIBUTED_N), batched=True, rounds=4,
                            parallelism=DISTRIBUTED_N)
    for result in ranks:
        assert result["x"].numpy().tobytes() == ranks[0]["x"].numpy().tobytes()  # the ranks agree bit for bit
        torch.testing.assert_close(result["x"], single[-1], atol=ATOL, rtol=RTOL)
        assert result["losses"] == pytest.approx([loss.item() for loss in losses], rel=RTOL)
        assert "the closure raised on rank 1 at point 2" in result["failure"]
    assert "rank 1 lost its data" in ranks[1]["failure"]
    assert all(rows == [0, 1] for rows in ranks[0]["asked"])
    assert all(rows == [2] for rows in ranks[1]["asked"])
    assert np.isfinite(ranks[0]["x"].numpy()).all()
