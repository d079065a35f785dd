"""``BatchedClosure``: the N evaluations of a round in one vectorized call.

``OptEx.step`` calls an ordinary closure once per evaluation row. A
``BatchedClosure`` knows the model, the loss and the data, so ``step`` can
instead evaluate all of this process's rows at once: ``torch.func.vmap`` over
the rows of the engine's (N, d) point matrix, each row's parameters swapped
into the model with ``torch.func.functional_call``, and one backward pass for
all rows. It is still an ordinary closure too (the sequential fallback).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.func import functional_call, vmap

from .layout import FlatLayout

LossFn = Callable[..., torch.Tensor]
RANDOMNESS = ("different", "same", "error")
# functional_call runs the wrapper below, whose child ``model`` is the user's model.
_MODEL_PREFIX = "model."


class _LossOfModel(torch.nn.Module):
    """``forward(*batch) = loss_fn(model, *batch)``: with the model as a child module,
    functional_call swaps its parameters under any loss code that calls ``model(...)``."""

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model = model
        self.loss_fn = loss_fn

    def forward(self, *batch: torch.Tensor) -> Any:
        return self.loss_fn(self.model, *batch)


class BatchedClosure:
    """``loss_fn(model, *batch)`` over ``data``, as a closure that ``optex.torch.OptEx.step``
    evaluates at all N points of a round in one vectorized call.

    ``BatchedClosure(model, loss_fn, data, *, randomness="different", vectorize=True)``

    - ``model``: the ``torch.nn.Module`` whose parameters the optimizer holds (all of
      them or some: parameters the optimizer does not hold keep the model's values).
    - ``loss_fn(model, *batch)``: ordinary code that calls ``model(...)`` and returns
      the scalar loss (a tensor with one element).
    - ``data``: either a tuple of tensors that every evaluation uses as ``batch``, or
      an object with a method ``batches_for(rows: list[int])`` returning a tuple of
      tensors whose leading dimension is ``len(rows)``: element k of each tensor is
      the minibatch of evaluation row ``rows[k]`` (``optex.torch.PointBatches``).

    **In step (vectorize=True).** ``opt.step(batched_closure)`` evaluates the rows this
    process owns (all N; under torch.distributed this rank's share) in one call:
    ``torch.func.vmap`` (with ``randomness``) over the rows of the engine's point
    matrix of ``torch.func.functional_call(model, row's parameters, batch)``, the
    parameters being views of the matrix, then one backward pass for the sum of the
    rows' losses, which gives each row its own gradient (the rows are independent).
    The gradients go into the engine's gradient rows (float32), the losses in
    float64; the parameters and their ``.grad`` are not touched during the
    evaluation. The optimizer's parameters are mapped to the model's by identity
    (``model.named_parameters()``); a parameter of the optimizer that is not one of
    the model's raises ValueError naming it. Parameters with ``requires_grad=False``
    are not in the engine (``optex.torch.OptEx`` leaves them out) and keep the
    model's values. A trainable parameter the loss does not use gets a zero
    gradient here, so the round steps it (momentum, weight decay), where with the
    sequential closure its ``.grad`` stays None and the round leaves it alone;
    freeze such parameters to keep torch.optim's rule. The result equals the
    sequential closure's up to float32 rounding: vmap computes the rows with
    batched kernels (batched matrix products, grouped convolutions), which may add
    in another order. Random operations follow ``randomness`` (``torch.func.vmap``'s):
    "different" (the default) draws independently per row, e.g. a dropout mask per
    row, "same" draws once for all rows, "error" refuses random operations. The
    draws come from torch's global generator, so the same ``torch.manual_seed``
    gives the same trajectory, but not the draws of the sequential closure.

    **Models vmap cannot run.** A module that updates a buffer in place during the
    forward pass cannot be vectorized: BatchNorm (and InstanceNorm) in training mode
    with ``track_running_stats=True`` raises ValueError naming it at construction
    and at each step; evaluate it in eval mode, construct it with
    ``track_running_stats=False``, or pass ``vectorize=False``. Anything else
    ``torch.func`` refuses (``.item()`` or data-dependent control flow in the loss,
    other in-place updates) raises ValueError at the step, with torch's reason and
    the same advice. A step that raises changes nothing: the round stays pending and
    the parameters hold the iterate.

    **Sequentially.** ``batched_closure()`` is also an ordinary closure: it zeroes the
    model's gradients, computes ``loss_fn(model, *batch)`` at the parameters' current
    values, calls ``backward()`` and returns the loss. With per-row data the batch is
    that of the row the optimizer evaluates (``opt.current_point`` of the last
    ``OptEx`` that stepped with this closure); calling it without such a row (outside
    ``step``, or during ``proxy="target"`` oracle calls) raises ValueError. With
    ``vectorize=False``, ``step`` calls it once per row like any closure (for models
    vmap cannot run).

    Whether the vectorized call is faster than the loop depends on the model and the
    device: it replaces N passes through the model by one, but vmap adds its own cost
    to every operation, so for small models on a CPU it can cost as much as the loop
    (``bench/python/torch_round_cost.py`` measures both).

    Bad arguments raise ValueError naming them; so do a loss that is not a tensor
    with one element and per-row data whose leading dimension is not the number of
    rows. A non-finite loss or gradient is handed to the engine as with any closure
    (``drop_nonfinite`` decides).
    """

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, data: Any, *,
                 randomness: str = "different", vectorize: bool = True) -> None:
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model: must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(loss_fn):
            raise ValueError(f"loss_fn: must be callable as loss_fn(model, *batch), got {loss_fn!r}")
        if isinstance(data, (tuple, list)):
            data = tuple(data)
            for j, item in enumerate(data):
                if not isinstance(item, torch.Tensor):
                    raise ValueError(f"data[{j}]: must be a tensor, got {type(item).__name__}")
        elif not callable(getattr(data, "batches_for", None)):
            raise ValueError(
                "data: must be a tuple of tensors (shared by every evaluation) or an object with "
                f"a method batches_for(rows) (one minibatch per row), got {type(data).__name__}"
            )
        if randomness not in RANDOMNESS:
            raise ValueError(f"randomness: must be one of {', '.join(map(repr, RANDOMNESS))}, got {randomness!r}")
        if not isinstance(vectorize, bool):
            raise ValueError(f"vectorize: must be a bool, got {vectorize!r}")
        if vectorize:
            _check_vectorizable(model)
        self._model = model
        self._loss_fn = loss_fn
        self._data = data
        self._randomness = randomness
        self._vectorize = vectorize
        self._wrapper = _LossOfModel(model, loss_fn)
        self._optimizer: Any = None  # the OptEx whose current_point the sequential call reads

    @property
    def model(self) -> torch.nn.Module:
        """The model whose parameters are evaluated."""
        return self._model

    @property
    def loss_fn(self) -> LossFn:
        """``loss_fn(model, *batch) -> loss``."""
        return self._loss_fn

    @property
    def data(self) -> Any:
        """The shared batch (a tuple of tensors) or the per-row source (``batches_for``)."""
        return self._data

    @property
    def randomness(self) -> str:
        """How random operations draw across the rows under vmap."""
        return self._randomness

    @property
    def vectorize(self) -> bool:
        """Whether ``step`` evaluates the rows in one vectorized call (else one by one)."""
        return self._vectorize

    def _bind_to(self, optimizer: Any) -> None:
        """Called by ``OptEx.step``: the sequential call evaluates ``optimizer.current_point``."""
        self._optimizer = optimizer

    # ------------------------------------------------------------------ sequential

    def __call__(self) -> torch.Tensor:
        """The closure protocol: zero the model's gradients, compute the loss at the
        parameters' current values, ``backward()``, return the loss."""
        batch = self._batch_of_current_row()
        self._model.zero_grad(set_to_none=True)
        with torch.enable_grad():
            loss = self._loss_fn(self._model, *batch)
            _check_scalar(loss)
            loss.backward()
        return loss

    def _batch_of_current_row(self) -> tuple[torch.Tensor, ...]:
        if isinstance(self._data, tuple):
            return self._data
        row = None if self._optimizer is None else self._optimizer.current_point
        if row is None:
            raise ValueError(
                "BatchedClosure: per-row data needs the evaluation row, which exists only while "
                "optex.torch.OptEx.step evaluates the closure (opt.current_point); call "
                "opt.step(closure) or use loss_fn directly"
            )
        return tuple(t[0] for t in self._row_batches([row]))

    def _row_batches(self, rows: list[int]) -> tuple[torch.Tensor, ...]:
        """``data.batches_for(rows)``, checked: a tuple of tensors with leading dimension len(rows)."""
        batches = self._data.batches_for(rows)
        if not isinstance(batches, (tuple, list)):
            raise ValueError(
                f"data.batches_for: must return a tuple of tensors, got {type(batches).__name__}"
            )
        for j, t in enumerate(batches):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"data.batches_for(...)[{j}]: must be a tensor, got {type(t).__name__}")
            if t.dim() == 0 or t.shape[0] != len(rows):
                raise ValueError(
                    f"data.batches_for(...)[{j}]: has shape {tuple(t.shape)}, but its leading dimension "
                    f"must be the number of rows asked for, {len(rows)}"
                )
        return tuple(batches)

    # ------------------------------------------------------------------ vectorized

    def _vectorized(self, names: tuple[str, ...],
                    batch_dims: tuple[int | None, ...]) -> Callable[..., torch.Tensor]:
        """vmap of one row's loss over (the rows' parameters, the batch)."""

        def row_loss(params: tuple[torch.Tensor, ...], *batch: torch.Tensor) -> torch.Tensor:
            loss = functional_call(self._wrapper, dict(zip(names, params)), batch)
            _check_scalar(loss)
            return loss.reshape(())

        return vmap(row_loss, in_dims=(0, *batch_dims), randomness=self._randomness)

    def evaluate_rows(self, layout: FlatLayout, points: torch.Tensor, rows: range,
                      grads_out: torch.Tensor, losses_out: torch.Tensor) -> dict[int, torch.Tensor]:
        """Evaluates the points of batch ``rows`` (``points[k]`` is row ``rows[k]``, whole)
        in one vectorized call; writes row ``rows[k]``'s gradient into ``grads_out[k]``
        (float32) and its loss into ``losses_out[k]`` (float64), and returns {row: its
        loss, a 0-dim tensor}. Everything is checked and computed before anything is
        written."""
        if len(rows) == 0:
            return {}
        _check_vectorizable(self._model)
        params = layout.params
        names = _model_names(self._model, params)
        if isinstance(self._data, tuple):
            batch, batch_dims = self._data, (None,) * len(self._data)
        else:
            batch = self._row_batches(list(rows))
            batch_dims = (0,) * len(batch)
        device = params[0].device
        block = points[:len(rows)]
        if block.device != device:
            block = block.to(device)
        # Each parameter's slice of every row, as a view of the point matrix; the ones the
        # optimizer trains are the leaves whose gradients the backward pass gives.
        leaves = [block[:, s.offset:s.stop].view(len(rows), *p.shape).detach().requires_grad_(p.requires_grad)
                  for p, s in zip(params, layout.segments())]
        trained = [leaf for leaf in leaves if leaf.requires_grad]
        with torch.enable_grad():  # step runs under no_grad
            as_params = tuple(leaf if leaf.dtype == p.dtype else leaf.to(p.dtype) for leaf, p in zip(leaves, params))
            try:
                losses = self._vectorized(names, batch_dims)(as_params, *batch)
                if trained and not losses.requires_grad:
                    raise ValueError("loss_fn: the loss does not depend on the optimizer's parameters "
                                     "(it has no gradient)")
                # The rows do not interact, so the gradient of the sum of their losses is each
                # row's own gradient: one ordinary backward pass through the vmapped graph,
                # cheaper than vmap(grad_and_value), which runs a grad transform inside vmap.
                grads = (torch.autograd.grad(losses.sum(), trained, allow_unused=True, materialize_grads=True)
                         if trained else ())
            except RuntimeError as error:
                raise ValueError(self._refusal(error)) from error
        trained_grads = iter(grads)
        for leaf, s in zip(leaves, layout.segments()):
            target = grads_out[:len(rows), s.offset:s.stop]
            if leaf.requires_grad:
                target.copy_(next(trained_grads).reshape(len(rows), s.size))
            else:
                target.zero_()
        losses = losses.detach()
        losses_out[:len(rows)].copy_(losses)
        return dict(zip(rows, losses.unbind()))

    def _refusal(self, error: RuntimeError) -> str:
        """What a ValueError says when torch.func could not evaluate the rows."""
        if self._randomness == "error" and "random" in str(error).lower():
            advice = ("randomness='error' refuses random operations such as dropout under vmap: pass "
                      "randomness='different' (independent draws per row) or 'same'")
        else:
            advice = ("pass vectorize=False to evaluate the rows one after another (the sequential "
                      "closure); a module that updates its buffers in place, such as BatchNorm in "
                      "training mode, runs under vmap in eval mode or with track_running_stats=False")
        return f"BatchedClosure: torch.func.vmap could not evaluate loss_fn over the rows ({error}); {advice}"


def _check_scalar(loss: Any) -> None:
    """ValueError unless ``loss`` is a tensor with one element (inside vmap: per row)."""
    if not isinstance(loss, torch.Tensor):
        raise ValueError(f"loss_fn: must return the loss as a tensor with one element, got {type(loss).__name__}")
    if loss.numel() != 1:
        raise ValueError(f"loss_fn: must return a scalar loss, got a tensor of shape {tuple(loss.shape)}")


def _model_names(model: torch.nn.Module, params: Sequence[torch.Tensor]) -> tuple[str, ...]:
    """functional_call's names (under the wrapper) of the optimizer's ``params``;
    ValueError for one that is not a parameter of ``model``."""
    by_identity = {id(p): name for name, p in model.named_parameters()}
    names = []
    for j, p in enumerate(params):
        name = by_identity.get(id(p))
        if name is None:
            raise ValueError(
                f"BatchedClosure: parameter {j} of the optimizer (in the order param groups, then "
                f"parameters; shape {tuple(p.shape)}) is not a parameter of the model"
            )
        names.append(_MODEL_PREFIX + name)
    return tuple(names)


def _check_vectorizable(model: torch.nn.Module) -> None:
    """ValueError naming the first module that updates running statistics in place in
    its forward pass (vmap cannot batch an in-place write into an unbatched buffer)."""
    for name, module in model.named_modules():
        if (module.training and getattr(module, "track_running_stats", False)
                and isinstance(getattr(module, "running_mean", None), torch.Tensor)):
            where = "model" if not name else f"model.{name}"
            raise ValueError(
                f"BatchedClosure: {where} ({type(module).__name__}) updates its running statistics in "
                "place in training mode, which torch.func.vmap cannot vectorize; call model.eval(), "
                "construct it with track_running_stats=False, or pass vectorize=False to evaluate "
                "the rows one after another"
            )
