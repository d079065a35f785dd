"""What optex.torch.OptEx.step hands to the closure and reads back is taken when the
closure returns: a closure that writes its loss or its gradients into buffers it
reuses, or keeps the tensors it produced, gives the same round, bit for bit, as one
that makes fresh tensors each call, and its kept tensors are never written into."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="optex.torch needs PyTorch (pip install torch); not installed here")

from optex.torch import OptEx  # noqa: E402
from torch_models import TwoHeads, bits, flat, loss_of, make_data  # noqa: E402

ROUNDS = 5


def make(**options):
    model = TwoHeads(seed=2)
    model.use_b = True
    # best_loss: the committed point is not always the last one evaluated, so a loss
    # read back late (after the round) would be the wrong row's.
    opt = OptEx(model.parameters(), lr=0.05, parallelism=4, seed=7, continue_from="best_loss",
                **options)
    return model, opt


def fresh(model, opt, data):
    def closure():
        opt.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        return loss

    return closure


def reused_loss_buffer(model, opt, data):
    """Every call's loss written into one tensor, which the closure returns."""
    buffer = torch.zeros((), dtype=torch.float32)

    def closure():
        opt.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        return buffer.copy_(loss.detach())

    return closure


def reused_grad_buffers(model, opt, data):
    """Gradients computed with torch.autograd.grad into buffers the closure owns and
    hands over as .grad at every call."""
    params = list(model.parameters())
    buffers = [torch.zeros_like(p) for p in params]

    def closure():
        loss = loss_of(model, data)
        for p, b, g in zip(params, buffers, torch.autograd.grad(loss, params)):
            b.copy_(g)
            p.grad = b
        return loss

    return closure


def python_float(model, opt, data):
    def closure():
        opt.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        return float(loss.detach())

    return closure


def run(make_closure, rounds: int = ROUNDS):
    data = make_data()
    model, opt = make()
    closure = make_closure(model, opt, data)
    returned = [opt.step(closure) for _ in range(rounds)]
    return bits(flat(model.parameters())), [float(r) for r in returned], opt


@pytest.mark.parametrize("make_closure", [reused_loss_buffer, reused_grad_buffers, python_float],
                         ids=lambda f: f.__name__)
def test_a_closure_reusing_its_buffers_gives_the_fresh_run(make_closure) -> None:
    expected_bits, expected_losses, _ = run(fresh)
    got_bits, got_losses, _ = run(make_closure)
    assert got_bits == expected_bits
    assert got_losses == expected_losses


def test_the_returned_loss_is_the_committed_rows_even_from_a_reused_buffer() -> None:
    """Independently: the loss at the committed iterate's row, recomputed by hand."""
    data = make_data()
    model, opt = make()
    losses_seen = []
    buffer = torch.zeros(())

    def closure():
        opt.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        losses_seen.append(float(loss.detach()))
        return buffer.copy_(loss.detach())

    found_other_than_last = False
    for _ in range(ROUNDS + 3):
        losses_seen.clear()
        returned = opt.step(closure)
        committed = opt.last_info.committed_point
        found_other_than_last |= committed != len(losses_seen) - 1
        assert float(returned) == losses_seen[committed]
        assert returned is not buffer
    assert found_other_than_last  # best_loss chose an earlier row at least once


def test_kept_gradients_are_never_written_into() -> None:
    """A closure that keeps the .grad tensors it produced (a log of gradients): step sets
    .grad to None before each call and copies the gradients out, so every kept tensor
    still holds its own call's gradient after the round."""
    data = make_data()
    model, opt = make()
    kept, snapshots = [], []

    def closure():
        opt.zero_grad()
        loss = loss_of(model, data)
        loss.backward()
        grads = [p.grad for p in model.parameters()]
        kept.append(grads)
        snapshots.append([g.clone() for g in grads])
        return loss

    for _ in range(2):
        opt.step(closure)
    assert len(kept) == 8
    for grads, copies in zip(kept, snapshots):
        assert all(bits(g) == bits(c) for g, c in zip(grads, copies))
    # Each call's gradients are their own tensors, not one buffer reused by step.
    assert len({id(g) for grads in kept for g in grads}) == 8 * len(kept[0])


def test_the_engine_received_the_gradients_at_each_call() -> None:
    """The gradients told are those of the points, not the last call's: the history's
    gradient rows differ per point, each the gradient at its point computed here."""
    data = make_data()
    model, opt = make(history=4)
    closure = reused_grad_buffers(model, opt, data)
    points = []

    def recording():
        points.append(flat(model.parameters()).clone())
        return closure()

    opt.step(recording)
    history = opt.engine.state_arrays()["history"]
    assert history["size"] == 4
    for i, point in enumerate(points):
        # The gradient at `point`, computed on a fresh model.
        offset = 0
        fresh_model = TwoHeads(seed=2)
        fresh_model.use_b = True
        with torch.no_grad():
            for p in fresh_model.parameters():
                p.copy_(point[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
        loss_of(fresh_model, data).backward()
        expected = flat(p.grad for p in fresh_model.parameters())
        assert bits(torch.from_numpy(history["gradients"][i])) == bits(expected), i
