"""``optex.torch.OptEx``: the ``torch.optim.Optimizer`` facade over the engine ``optex.OptEx``.

The facade owns the torch.optim side (param groups, ``step(closure)``,
``state_dict``) and the engine's lifetime; the other modules of optex.torch
do the parts: hyperparameters.py (torch.optim's names -> the engine's values),
layout.py (parameters <-> the flat vector), closure.py (calling the closure at
a point), exchange.py (torch.distributed).
"""

from __future__ import annotations

import itertools
import os
import tempfile
from collections.abc import Iterable
from typing import Any, Union

import numpy as np
import torch

from .._optex import IterationInfo, Options, built_with_cuda
from .._optex import OptEx as _Engine
from . import hyperparameters as _hyper
from .batched import BatchedClosure
from .closure import Closure, check_closure, committed_rows, evaluate, loss_at
from .exchange import Ranks, distributed_available, distributed_enabled
from .layout import FlatLayout

ParamsT = Union[Iterable[torch.Tensor], Iterable[dict[str, Any]]]
# The key of the engine checkpoint in state_dict()["state"][0].
_CHECKPOINT_KEY = "optex_checkpoint"


class OptEx(torch.optim.Optimizer):
    """OptEx (Shu, Fang, He, Yu, NeurIPS 2024) as a ``torch.optim.Optimizer``.

    ``OptEx(params, optimizer="adam", lr=1e-3, ..., parallelism=4, ...)``

    **Base optimizer.** ``optimizer`` names one of the engine's optimizer
    classes, ``optex.optimizer_classes()``, in lower case: today "sgd",
    "adam", "adamw", "rmsprop" and "lion" (``optex.Sgd``, ``optex.Adam``,
    ``optex.AdamW``, ``optex.RmsProp``, ``optex.Lion``), and any class the
    library adds later. Its hyperparameters take torch.optim's names by one
    rule: each of the class's ``hyperparameters`` keeps its name, except that
    ``beta1`` and ``beta2`` form torch's ``betas`` pair. So "adam" and "adamw"
    take ``lr``, ``betas``, ``eps``, ``weight_decay``; "sgd" ``lr``,
    ``momentum``, ``nesterov``, ``weight_decay``; "rmsprop" ``lr``,
    ``alpha``, ``eps``, ``weight_decay``, ``momentum``, ``centered``; "lion"
    ``lr``, ``betas``, ``weight_decay``. They are the keys of the param
    groups, and keyword arguments here (``betas``, ``eps``,
    ``weight_decay``, ``momentum`` and ``nesterov`` also positionally, after
    ``lr``, as before). Each one's default is the class's own default
    (``optex.Adam()``, ``optex.RmsProp()``, ...; for the optimizers torch.optim
    has, torch.optim's): ``betas`` (0.9, 0.999), ``eps`` 1e-8,
    ``weight_decay`` 0 (1e-2 for "adamw"); ``momentum`` 0, ``nesterov``
    False; ``alpha`` 0.99, ``centered`` False; Lion's ``betas`` (0.9, 0.99).
    The exception is ``lr``, whose default here is 1e-3 for every optimizer
    (the classes' own defaults differ: 1e-2 for RmsProp, 1e-4 for Lion).
    Passing a hyperparameter that the chosen optimizer does not take
    (``momentum`` with Adam, ``betas`` with SGD, ``alpha`` with Lion, a
    misspelled name) raises ValueError naming it and listing what the
    optimizer takes. The update rules are the engine's: torch.optim's
    single-tensor formulas (torch's ``amsgrad``, ``maximize``,
    ``dampening`` are not offered), and for Lion the ``lion-pytorch``
    package's.

    **OptEx options.** ``parallelism`` (N), ``history``, ``kernel``,
    ``lengthscale``, ``noise``, ``input_scaling``, ``warmup``,
    ``lengthscale_selection``, ``selection_interval``, ``lengthscale_grid``,
    ``proxy``, ``seed``, ``evaluations_per_point``, ``strategy``,
    ``continue_from``, ``max_posterior_variance``, ``trust_region``,
    ``max_lengthscale_change``, ``device`` and ``history_precision`` set the
    fields of ``optex.Options`` (defaults: the C++ ones); ``options`` passes a
    whole ``optex.Options`` (``optex.Options.adaptive(N)`` for the robust
    configuration) that the keywords then override, all validated together.
    With ``evaluations_per_point`` D > 1 the N evaluations of a round are N / D
    points, each evaluated D times with D seeds (``current_seed``).
    ``device=None`` (the
    default) runs the engine where the parameters live: "cuda:k" for
    parameters on GPU k when ``optex.built_with_cuda()``, "cpu" otherwise.

    **Seed.** ``seed``, the run's seed (the engine's per-evaluation seeds,
    ``current_seed``, follow from it, and so do ``optex.torch.PointBatches``'
    epochs), defaults to one draw from torch's default generator at
    construction when neither ``seed`` nor ``options`` is given, as
    DataLoader's RandomSampler draws its seed: ``torch.manual_seed(s)`` before
    the construction repeats a run, and another ``s`` gives another. The draw
    advances torch's default generator once; a construction that raises draws
    nothing. With ``options`` and no ``seed``, the run's seed is
    ``options.seed``. Under torch.distributed the ranks run rank 0's drawn
    seed, adopted at the first ``step`` with its start point. The property
    :attr:`seed` says which it is.

    **step(closure).** The closure protocol of ``torch.optim.LBFGS``: the
    closure zeroes the gradients, computes the loss, calls ``backward()`` and
    returns the loss. A step is one OptEx round: the engine's ``ask()`` gives N
    points; for each, ``step`` writes the point into the parameters, sets their
    ``.grad`` to None, calls the closure and reads the gradients (a parameter
    whose ``.grad`` is still None contributes a zero gradient; unlike
    torch.optim, which skips such a parameter, the engine then still applies
    weight decay to it). Then it restores the parameters, ``tell()``s the
    engine the N gradients and losses, and writes the committed iterate into
    the parameters. It returns the closure's loss at the committed point (the
    last point of the round unless points were dropped or ``continue_from`` is
    "best_loss"); for a point evaluated several times, the mean of its losses
    (``last_info.loss``) as a 0-dim tensor. While the closure runs,
    :attr:`current_point` and :attr:`current_seed` say which of the N
    evaluations (batch rows) it is computing and that evaluation's own
    reproducible seed (for its minibatch). A closure that takes its batch
    from a loop outside ``step`` gives all N evaluations the same batch;
    ``optex.torch.PointBatches`` gives each its own.
    Without torch.distributed, the N evaluations run one after the other in
    this process: the trajectory is OptEx's (fewer rounds), the wall-clock
    speedup needs N workers (see below). After ``step``, ``.grad`` holds the
    gradient of the last point this process evaluated.

    **Parameter layout.** All parameters of all param groups form one float32
    vector for one engine, in the order param groups, then the parameters of
    each group, each flattened in row-major order. The engine works in
    float32: parameters of another floating dtype hold the engine's float32
    values cast to their dtype, and their gradients are rounded to float32.
    All parameters must be on one device.

    **Param groups.** The engine runs ONE base optimizer over the whole
    vector, so every param group must have the same hyperparameters (``lr``
    and the others of the chosen optimizer); a group that differs raises
    ValueError naming the group and the setting (per-group values, such as
    no weight decay on biases, are not supported). Groups still work for
    organising parameters. ``add_param_group`` works until the first
    ``step``; afterwards the engine's dimension is fixed and it raises
    RuntimeError.

    **LR schedulers.** Hyperparameters changed between steps (by a
    ``torch.optim.lr_scheduler``, or by hand in every group alike) take
    effect at the next ``step``, and the engine keeps its state (moments,
    step count, history), as ``optex.OptEx.set_optimizer``. A change the
    engine's state cannot follow raises ValueError: momentum switching
    between zero and non-zero (SGD, RMSprop), RMSprop's ``centered``.

    **The iterate belongs to the engine.** The engine is created at the first
    ``step`` from the parameters' values then (so weights loaded after the
    optimizer was constructed are used). Afterwards ``step`` checks that the
    parameters still hold the committed iterate and raises RuntimeError if
    they were changed outside ``step`` (the engine cannot adopt a new
    iterate without losing its history).

    **Checkpoints.** ``state_dict()`` has torch.optim's shape: ``{"state":
    {0: {"optex_checkpoint": bytes, "iteration": int}}, "param_groups":
    [...]}``, the bytes being the engine's checkpoint (``optex.OptEx.save``:
    iterate, optimizer state, history, random state, options). The state is
    empty before the first step. ``load_state_dict`` restores it, and the run
    continues bit for bit. ``state_dict()`` raises RuntimeError after a step
    that failed mid-round (the round is still pending; call ``step`` again to
    finish it first).

    **torch.distributed.** When ``torch.distributed`` is initialised (or
    ``distributed=True``), the ranks of ``process_group`` (default: the world)
    share the work of a round: rank r evaluates a contiguous block of the N
    points (``optex.point_range``: N // W each, the first N % W ranks one
    more, as the C++ DistributedEngine), the gradients (float32) and losses
    (float64) are all-gathered, and every rank tells its engine the same full
    batch, so the engines stay identical and the result is bit for bit the
    single-process one. At the first step the ranks check that they agree on the
    hyperparameters, options and dimension, and take rank 0's parameter
    values as the start. With the "nccl" backend the exchange uses tensors on
    the parameters' GPU, otherwise CPU tensors. A closure that raises on one
    rank makes every rank raise RuntimeError (naming the rank) instead of
    hanging. Pass ``distributed=False`` to let every rank evaluate all N
    points itself (e.g. when the closure's backward already all-reduces, as
    under DistributedDataParallel).

    **CUDA.** With parameters on a GPU and ``optex.built_with_cuda()``, the
    engine runs on that GPU, and ``step`` wraps the engine's own point and
    gradient rows with DLPack (``optex.OptEx.device_points`` /
    ``device_grads``): points, gradients and the iterate stay in GPU memory,
    and nothing of size d crosses to the host (under torch.distributed with
    a CPU backend such as gloo, the gathered gradients do). Without the CUDA
    backend the engine runs on the host and the parameters are copied each
    way.

    ``drop_nonfinite=True`` lets the engine drop points whose loss or
    gradient is not finite (otherwise ``step`` raises ValueError and the
    round stays pending). Bad arguments raise ValueError naming them.
    """

    def __init__(
        self,
        params: ParamsT,
        optimizer: str = "adam",
        lr: float = 1e-3,
        betas: tuple[float, float] | None = None,
        eps: float | None = None,
        weight_decay: float | None = None,
        momentum: float | None = None,
        nesterov: bool | None = None,
        *,
        options: Options | None = None,
        parallelism: int | None = None,
        history: int | None = None,
        kernel: str | None = None,
        lengthscale: float | None = None,
        noise: float | None = None,
        input_scaling: str | None = None,
        warmup: str | None = None,
        lengthscale_selection: str | None = None,
        selection_interval: int | None = None,
        lengthscale_grid: Iterable[float] | None = None,
        proxy: str | None = None,
        seed: int | None = None,
        evaluations_per_point: int | None = None,
        strategy: str | None = None,
        continue_from: str | None = None,
        max_posterior_variance: float | None = None,
        trust_region: float | None = None,
        max_lengthscale_change: float | None = None,
        device: str | torch.device | None = None,
        history_precision: str | None = None,
        drop_nonfinite: bool = False,
        distributed: bool | None = None,
        process_group: Any = None,
        **hyperparameters: Any,
    ) -> None:
        # The named hyperparameters (None: not given), then the other optimizers' ones.
        given = {name: value for name, value in (("betas", betas), ("eps", eps),
                                                 ("weight_decay", weight_decay),
                                                 ("momentum", momentum), ("nesterov", nesterov))
                 if value is not None}
        given.update(hyperparameters)
        defaults = _hyper.defaults(optimizer, lr, given)
        self._kind = optimizer
        # Validates the defaults with their own names (before any group exists).
        _hyper.make_optimizer(self._kind, defaults, where="")
        self._options = _hyper.make_options(options, {
            "parallelism": parallelism,
            "history": history,
            "kernel": kernel,
            "lengthscale": lengthscale,
            "noise": noise,
            "input_scaling": input_scaling,
            "warmup": warmup,
            "lengthscale_selection": lengthscale_selection,
            "selection_interval": selection_interval,
            "lengthscale_grid": lengthscale_grid,
            "proxy": proxy,
            "seed": seed,
            "evaluations_per_point": evaluations_per_point,
            "strategy": strategy,
            "continue_from": continue_from,
            "max_posterior_variance": max_posterior_variance,
            "trust_region": trust_region,
            "max_lengthscale_change": max_lengthscale_change,
            "history_precision": history_precision,
        })
        if device is not None and not isinstance(device, (str, torch.device)):
            raise ValueError(f"device: must be a str, a torch.device or None, got {device!r}")
        self._device: str | None = None if device is None else str(device)
        if not isinstance(drop_nonfinite, bool):
            raise ValueError(f"drop_nonfinite: must be a bool, got {drop_nonfinite!r}")
        self._drop_nonfinite = drop_nonfinite
        if distributed is not None and not isinstance(distributed, bool):
            raise ValueError(f"distributed: must be a bool or None, got {distributed!r}")
        if distributed and not distributed_available():
            raise ValueError(
                "distributed: True needs an initialised torch.distributed "
                "(torch.distributed.init_process_group)"
            )
        self._distributed_flag = distributed
        self._group = process_group

        self._engine: _Engine | None = None
        self._iterate: torch.Tensor | None = None  # the committed iterate, float32, on the params' device
        self._layout: FlatLayout | None = None  # fixed with the engine
        self._buffers: dict[str, torch.Tensor] = {}
        self._last_info: IterationInfo | None = None
        self._current_point: int | None = None
        self._current_seed: int | None = None
        self._current_oracle_row: int | None = None
        self._iteration = 0  # rounds committed; readable while the engine is busy in ask()
        self._seed_drawn = False  # from torch's generator: under torch.distributed, rank 0's wins
        self._constructed = False

        super().__init__(params, defaults)
        self._constructed = True
        if not self._params():
            raise ValueError("params: the param groups contain no parameters")
        if sum(p.numel() for p in self._params()) == 0:
            raise ValueError("params: the parameters have no elements")
        # Validates the options, the hyperparameters and the device now, with a
        # one-dimensional engine; the real one is created at the first step.
        _Engine(np.zeros(1, np.float32), _hyper.make_optimizer(self._kind, self.param_groups[0], where=""),
                _hyper.options_on(self._options, self._engine_device()))
        if seed is None and options is None:
            # Last, so that a refused construction leaves torch's generator alone.
            self._options.seed = int(torch.empty((), dtype=torch.int64).random_().item())
            self._seed_drawn = True

    # ------------------------------------------------------------------ properties

    @property
    def engine(self) -> _Engine | None:
        """The underlying ``optex.OptEx`` engine (None before the first step), for
        inspection (``iteration``, ``lengthscale``, ``options``...). Calling its
        ``ask``/``tell`` directly desynchronises this optimizer."""
        return self._engine

    @property
    def last_info(self) -> IterationInfo | None:
        """The ``optex.IterationInfo`` of the last step (loss, gradient norm, the mean
        cosine between predicted and true gradients, lengthscale...); None before."""
        return self._last_info

    @property
    def current_point(self) -> int | None:
        """While the closure runs inside ``step``: the index (0..N-1) of the evaluation
        (batch row) it is computing; the rows of a point evaluated several times are
        consecutive and hold the same point. None otherwise (and during
        proxy='target' oracle calls)."""
        return self._current_point

    @property
    def current_seed(self) -> int | None:
        """While the closure runs inside ``step``: the evaluation's own seed (the
        engine's ``seeds[i]``; the run's seed during proxy='target' oracle calls),
        the same on every run and every rank: use it to draw the minibatch."""
        return self._current_seed

    @property
    def parallelism(self) -> int:
        """N, the number of evaluations (batch rows) of each round."""
        # The options hold the engine's N (load_state_dict takes the checkpoint's), and
        # stay readable while the engine is busy calling the proxy='target' oracle.
        return int(self._options.parallelism)

    # -- read by optex.torch.PointBatches (the evaluation numbering) --

    @property
    def iteration(self) -> int:
        """The rounds committed so far (0 before the first step; a step that raised
        commits nothing). Inside ``step`` it is the number of the round being computed."""
        return self._iteration

    @property
    def seed(self) -> int:
        """The run's seed (``optex.Options.seed``): ``seed=``, ``options.seed``, or the
        draw from torch's default generator at construction (under torch.distributed,
        rank 0's from the first step on); a checkpoint's after ``load_state_dict``."""
        return int(self._options.seed)

    @property
    def current_oracle_row(self) -> int | None:
        """During a proxy='target' oracle call inside ``step``: the first batch row of
        the point whose true gradient the engine is asking for (points are asked in
        order, before their rows are evaluated). None otherwise."""
        return self._current_oracle_row

    # -- end of PointBatches' properties --

    # ------------------------------------------------------------------ param groups

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Adds a param group (torch.optim's contract). Its hyperparameters must equal
        the other groups' (ValueError naming the group and the setting otherwise).
        Works until the first ``step``; afterwards the engine's dimension is fixed and
        this raises RuntimeError."""
        if self._constructed and self._engine is not None:
            raise RuntimeError(
                "add_param_group: not supported after the first step (or load_state_dict): "
                "the OptEx engine's dimension is fixed; construct a new optimizer with all "
                "parameters instead"
            )
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        g = len(self.param_groups) - 1
        params = group["params"]
        try:
            if len(params) != len({id(p) for p in params}):
                raise ValueError(f"param_groups[{g}]: contains the same parameter twice")
            for j, p in enumerate(params):
                if not p.is_floating_point():
                    raise ValueError(
                        f"param_groups[{g}]['params'][{j}]: must be a floating-point tensor, "
                        f"got dtype {p.dtype}"
                    )
                if p.is_sparse:
                    raise ValueError(f"param_groups[{g}]['params'][{j}]: sparse tensors are not supported")
            first = self._params()[0] if self._params() else None
            for j, p in enumerate(params):
                if first is not None and p.device != first.device:
                    raise ValueError(
                        f"param_groups[{g}]['params'][{j}]: on {p.device}, but the first "
                        f"parameter is on {first.device}; all parameters of an "
                        "optex.torch.OptEx must be on one device"
                    )
            _hyper.shared_optimizer(self._kind, self.param_groups)
        except ValueError:
            self.param_groups.pop()
            raise

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _param_device(self) -> torch.device:
        return self._params()[0].device

    def _make_layout(self) -> FlatLayout:
        return FlatLayout([group["params"] for group in self.param_groups])

    def _engine_device(self) -> str:
        """The engine's device: the one asked for, else the parameters'."""
        if self._device is not None:
            return self._device
        dev = self._param_device()
        if dev.type == "cuda" and built_with_cuda():
            return f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
        return "cpu"

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A cached scratch tensor (pinned host memory when the parameters are on a GPU)."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype or buf.device != device:
            pin = device.type == "cpu" and self._param_device().type == "cuda"
            buf = torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)
            self._buffers[name] = buf
        return buf

    # ------------------------------------------------------------------ the engine

    def _ranks(self) -> Ranks | None:
        """The ranks sharing this step's points; None without torch.distributed."""
        if not distributed_enabled(self._distributed_flag):
            return None
        return Ranks(self._group, self._param_device())

    def _agree(self, ranks: Ranks, optimizer: _hyper.EngineOptimizer,
               options: Options, dim: int) -> None:
        ranks.agree(f"{optimizer!r}|{_hyper.options_key(options)}|{dim}")

    def _create_engine(self, optimizer: _hyper.EngineOptimizer) -> None:
        """The engine, from the parameters' values now (rank 0's when distributed)."""
        layout = self._make_layout()
        options = _hyper.options_on(self._options, self._engine_device())
        x0 = layout.flatten()
        ranks = self._ranks()
        if ranks is not None:
            if self._seed_drawn:
                # Each rank drew its own seed; the run takes rank 0's, as it takes its start.
                seed = torch.tensor([options.seed], dtype=torch.int64)
                options.seed = int(ranks.broadcast_start(seed)[0])
            self._agree(ranks, optimizer, options, layout.dim)
            x0 = ranks.broadcast_start(x0)
            layout.write(x0)
        self._layout = layout
        self._engine = _Engine(x0.cpu().numpy(), optimizer, options)
        self._options.seed = options.seed
        self._iterate = x0

    def _follow_schedule(self, optimizer: _hyper.EngineOptimizer) -> None:
        """The groups' hyperparameters changed since the last step (an LR scheduler):
        the engine takes them and keeps its state."""
        assert self._engine is not None
        ranks = self._ranks()
        if ranks is not None:
            self._agree(ranks, optimizer, self._engine.options, self._engine.dim)
        try:
            self._engine.set_optimizer(optimizer)
        except ValueError as error:
            raise ValueError(
                f"step: the hyperparameters changed to {optimizer!r}, which the running engine "
                f"({self._engine.optimizer!r}) cannot take: {error}"
            ) from None

    def _oracle(self, closure: Closure, seed: int, row: int, x: np.ndarray) -> tuple[float, np.ndarray]:
        """The true gradient for proxy='target', called by the engine inside ask()
        (`seed`: the run's seed; `row`: the first batch row of the point `x`)."""
        assert self._layout is not None
        point = torch.from_numpy(x).to(self._layout.device)
        grad = torch.empty_like(point)
        self._current_point, self._current_seed, self._current_oracle_row = None, seed, row
        try:
            _, loss = evaluate(closure, self._layout, point, grad)
        finally:
            self._current_point = self._current_seed = self._current_oracle_row = None
        return loss, grad.cpu().numpy()

    # ------------------------------------------------------------------ step

    @torch.no_grad()
    def step(self, closure: Closure | None = None) -> Any:  # type: ignore[override]
        """One OptEx round: evaluates ``closure`` at the engine's N points and commits.

        ``closure()`` must zero the gradients, compute the loss, call ``backward()``
        and return the loss (LBFGS's protocol); ``step`` calls it N times (or this
        rank's share of the N points under torch.distributed). Returns the
        closure's loss at the committed point; under torch.distributed, a rank
        that did not evaluate that point gets the gathered value (a 0-dim tensor
        of the dtype and device of its own losses, or a float). A point evaluated
        several times returns the mean of its losses in that form. An
        ``optex.torch.BatchedClosure`` (with ``vectorize=True``) is instead evaluated at
        all of these points in one vectorized call.

        Raises ValueError without a closure or when the closure returns no scalar
        loss; RuntimeError when the parameters or hyperparameters were changed
        since the last step. If the closure raises, the parameters are restored
        and the round stays pending: the next ``step`` evaluates the same points.
        """
        check_closure(closure)
        if isinstance(closure, BatchedClosure):
            closure._bind_to(self)  # its sequential form evaluates this optimizer's current_point
        optimizer = _hyper.shared_optimizer(self._kind, self.param_groups)
        if self._engine is None:
            self._create_engine(optimizer)
        else:
            assert self._layout is not None and self._iterate is not None
            self._layout.check_holds(self._iterate)
            if optimizer != self._engine.optimizer:
                self._follow_schedule(optimizer)
        engine, layout = self._engine, self._layout
        assert engine is not None and layout is not None and self._iterate is not None
        n, d = engine.parallelism, engine.dim
        dev = layout.device

        # The engine's own point and gradient rows, wrapped without a copy
        # (DLPack): on a CUDA engine they stay in GPU memory.
        target = engine.options.proxy == "target"
        if target:
            run_seed = int(engine.options.seed)
            # The engine asks for the points in order, once each per round.
            oracle_rows = itertools.count(0, int(engine.options.evaluations_per_point))
            engine.set_gradient_oracle(lambda x: self._oracle(closure, run_seed, next(oracle_rows), x))
        try:
            points = torch.from_dlpack(engine.device_points())
        finally:
            if target:
                engine.set_gradient_oracle(None)
        rows = torch.from_dlpack(engine.device_grads())
        seeds = engine.seeds

        # This process's points, and where their gradients and losses go: alone,
        # straight into the engine's rows; under torch.distributed, into buffers
        # that the ranks then exchange.
        ranks = self._ranks()
        if ranks is None:
            mine, grads_local = range(n), rows
            losses_local = torch.zeros(n, dtype=torch.float64)
        else:
            mine, width = ranks.points(n), ranks.width(n)
            grads_local = self._buffer("grads_local", (width, d), torch.float32, ranks.device)
            losses_local = ranks.losses_buffer(width)
        # The closure needs its point, and gives its gradient, on the parameters' device.
        scratch_point = self._buffer("point", (d,), torch.float32, dev) if points.device != dev else None
        scratch_grad = (self._buffer("grad", (d,), torch.float32, dev)
                        if grads_local.device != dev else None)

        results: dict[int, Any] = {}
        failure: BaseException | None = None
        try:
            if isinstance(closure, BatchedClosure) and closure.vectorize:
                # batched.py: all of this process's rows in one vectorized call, not one by one.
                try:
                    results = closure.evaluate_rows(layout, points, mine, grads_local, losses_local)
                except Exception as error:
                    if ranks is None:
                        raise
                    failure = error
                    ranks.flag_failure(losses_local, mine.start)
            else:
                for k, i in enumerate(mine):
                    if scratch_point is not None:
                        scratch_point.copy_(points[i])
                        point = scratch_point
                    else:
                        point = points[i]
                    out = grads_local[k] if scratch_grad is None else scratch_grad
                    self._current_point, self._current_seed = i, int(seeds[i])
                    try:
                        results[i], losses_local[k] = evaluate(closure, layout, point, out)
                    except Exception as error:
                        if ranks is None:
                            raise
                        # The other ranks must learn of it in the gather, not hang in it.
                        failure = error
                        ranks.flag_failure(losses_local, i)
                        break
                    if scratch_grad is not None:
                        grads_local[k].copy_(scratch_grad)
        finally:
            self._current_point = self._current_seed = None
            layout.write(self._iterate)

        if ranks is None:
            losses = losses_local
        else:
            losses = ranks.gather(grads_local, losses_local, rows, failure)
        if rows.device.type == "cuda":
            torch.cuda.synchronize(rows.device)  # the engine reads the rows on its own stream
        info = engine.tell_device(losses.numpy(), drop_nonfinite=self._drop_nonfinite)
        self._last_info = info
        self._iteration = int(engine.iteration)

        # A copy: the engine rewrites its iterate in place at the next commit.
        self._iterate = torch.from_dlpack(engine.device_x()).to(dev, copy=True)
        layout.write(self._iterate)
        rows = committed_rows(info.committed_point, info.point_evaluations)
        return loss_at(rows, info.loss, results, losses)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's ``{"state": ..., "param_groups": ...}``; the state is
        ``{0: {"optex_checkpoint": bytes, "iteration": int}}`` (the engine's
        checkpoint, ``optex.OptEx.save``'s format) after the first step, ``{}``
        before. RuntimeError while a round is pending (a step failed mid-round)."""
        if self._engine is None:
            return super().state_dict()
        if self._engine.pending:
            raise RuntimeError(
                "state_dict: the last step failed mid-round and its round is still pending; "
                "call step(closure) again to finish it before saving"
            )
        first = self._params()[0]
        self.state[first] = {_CHECKPOINT_KEY: _engine_bytes(self._engine),
                             "iteration": int(self._engine.iteration)}
        try:
            return super().state_dict()
        finally:
            self.state.pop(first, None)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a ``state_dict()`` (torch.optim's contract: the param groups
        must match in number and sizes). The engine resumes from the checkpoint on
        this optimizer's device and the run continues bit for bit. The parameters
        are not changed: they must hold the checkpoint's iterate at the next step
        (load the model's matching state_dict). ValueError for a state that is not
        an optex.torch.OptEx state or whose dimension differs."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("state_dict: expected a dict with 'state' and 'param_groups'")
        state = state_dict["state"]
        blob = None
        if state:
            entry = state.get(0) if isinstance(state, dict) else None
            if (len(state) != 1 or not isinstance(entry, dict)
                    or not isinstance(entry.get(_CHECKPOINT_KEY), (bytes, bytearray))):
                raise ValueError(
                    "state_dict: not an optex.torch.OptEx state (expected 'state' to be empty "
                    f"or {{0: {{'{_CHECKPOINT_KEY}': bytes, ...}}}}, got keys {list(state)})"
                )
            blob = bytes(entry[_CHECKPOINT_KEY])
        groups = state_dict["param_groups"]
        for g, group in enumerate(groups if isinstance(groups, list) else []):
            missing = [k for k in _hyper.GROUP_KEYS[self._kind] if not (isinstance(group, dict) and k in group)]
            if missing:
                raise ValueError(
                    f"state_dict: param_groups[{g}] has no {', '.join(missing)}: not a state of an "
                    f"optex.torch.OptEx with optimizer={self._kind!r}"
                )
        engine = layout = None
        if blob is not None:
            engine = _engine_from_bytes(blob, self._engine_device())
            kind = _hyper.kind_of(engine.optimizer)
            if kind != self._kind:
                raise ValueError(
                    f"state_dict: saved with optimizer={kind!r}, this optimizer has "
                    f"optimizer={self._kind!r}"
                )
            layout = self._make_layout()
            if engine.dim != layout.dim:
                raise ValueError(
                    f"state_dict: the checkpoint is for {engine.dim} parameters, this optimizer "
                    f"has {layout.dim}"
                )
        super().load_state_dict(state_dict)
        self.state.clear()
        self._engine, self._layout, self._last_info = engine, layout, None
        self._iteration = 0 if engine is None else int(engine.iteration)
        if engine is None:
            self._iterate = None
            return
        self._options = engine.options
        self._iterate = torch.from_numpy(engine.x).to(self._param_device())


# The engine checkpoints through a file (optex.OptEx.save/load); state_dict holds its bytes.

def _engine_bytes(engine: _Engine) -> bytes:
    with tempfile.TemporaryDirectory(prefix="optex-") as tmp:
        path = os.path.join(tmp, "engine.ckpt")
        engine.save(path)
        with open(path, "rb") as f:
            return f.read()


def _engine_from_bytes(blob: bytes, device: str) -> _Engine:
    with tempfile.TemporaryDirectory(prefix="optex-") as tmp:
        path = os.path.join(tmp, "engine.ckpt")
        with open(path, "wb") as f:
            f.write(blob)
        try:
            return _Engine.load(path, device=device)
        except RuntimeError as error:
            raise ValueError(f"state_dict: the engine checkpoint cannot be read: {error}") from None
