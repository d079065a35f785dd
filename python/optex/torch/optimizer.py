"""``optex.torch.OptEx``: the ``torch.optim.Optimizer`` facade over the engine ``optex.OptEx``.

The facade owns the torch.optim side (param groups, ``step(closure)``,
``state_dict``) and the engine's lifetime; the other modules of optex.torch
do the parts: hyperparameters.py (torch.optim's names -> the engine's values),
layout.py (parameters <-> the flat vector), closure.py (calling the closure at
a point), exchange.py (torch.distributed).
"""

from __future__ import annotations

import copy
import itertools
import os
import tempfile
from collections.abc import Iterable
from typing import Any, Union

import numpy as np
import torch

from .._optex import IterationInfo, Options, built_with_cuda
from .._optex import OptEx as _Engine
from . import checkpoint as _checkpoint
from . import hyperparameters as _hyper
from . import state_dict_checks as _checks
from .batched import BatchedClosure
from .closure import Closure, check_closure, committed_rows, evaluate, loss_at
from .committed_buffers import CommittedBuffers, buffers_of
from .exchange import Ranks, distributed_available, distributed_enabled
from .layout import FlatLayout
from .sharded import OPTION as _SHARD_STATE
from .sharded import Shards, check_options, slices
from .trainable import (Shelf, StepOffsets, engine_optimizer, engine_ranges, merged_segments,
                        range_entries, rebuild_state, same_parameters, trainable_groups)

ParamsT = Union[Iterable[torch.Tensor], Iterable[dict[str, Any]]]
# The key of the engine checkpoint in state_dict()["state"][0].
_CHECKPOINT_KEY = "optex_checkpoint"


def _check_parameter(p: Any, where: str) -> None:
    """ValueError unless ``p`` is a dense floating-point tensor the engine can hold:
    float32, or float16/bfloat16 (which hold the engine's float32 values rounded).
    float64 is refused rather than silently computed in float32."""
    if not isinstance(p, torch.Tensor):
        raise ValueError(f"{where}: must be a tensor, got {type(p).__name__}")
    if not p.is_floating_point():
        raise ValueError(f"{where}: must be a floating-point tensor, got dtype {p.dtype}")
    if p.dtype == torch.float64:
        raise ValueError(
            f"{where}: float64 parameters are not supported: the OptEx engine computes in "
            "float32 and would round them silently; convert the model with .float() (or "
            "keep torch.optim for float64 training)"
        )
    if p.is_sparse:
        raise ValueError(f"{where}: sparse tensors are not supported")


def _check_shard_state(shard_state: Any, distributed: bool | None, device: Any) -> bool:
    """``shard_state``, checked: ValueError naming it where it cannot work."""
    if not isinstance(shard_state, bool):
        raise ValueError(f"{_SHARD_STATE}: must be a bool, got {shard_state!r}")
    if not shard_state:
        return False
    if distributed is False:
        raise ValueError(f"{_SHARD_STATE}: True shares the state over the ranks of torch.distributed; "
                         "it cannot be combined with distributed=False")
    if not distributed_available():
        raise ValueError(f"{_SHARD_STATE}: True needs an initialised torch.distributed "
                         "(torch.distributed.init_process_group): each rank keeps one slice of the "
                         "state")
    if device is not None and str(device).split(":")[0] != "cpu":
        raise ValueError(f"{_SHARD_STATE}: the sharded engine runs on the CPU (sharded state on a GPU "
                         f"is not available yet); got device={str(device)!r}")
    return True


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
    ``max_lengthscale_change``, ``mode`` and ``tolerance`` (``mode="verified"``:
    the base optimizer's own trajectory, several of its steps a round; see
    ``optex.Options.verified``), ``device``, ``threads`` (the CPU's passes over
    the parameters; 0: every core, the same results on any count) and
    ``history_precision`` set the fields of ``optex.Options`` (defaults: the
    C++ ones); ``options`` passes a
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
    ``.grad`` to None, calls the closure and reads the gradients. Then it
    restores the parameters, ``tell()``s the engine the N gradients and
    losses, and writes the committed iterate into the parameters. It returns
    the closure's loss at the committed point (the last point of the round
    unless points were dropped or ``continue_from`` is "best_loss"); for a
    point evaluated several times, the mean of its losses (``last_info.loss``)
    as a 0-dim tensor. While the closure runs, :attr:`current_point` and
    :attr:`current_seed` say which of the N evaluations (batch rows) it is
    computing and that evaluation's own reproducible seed (for its
    minibatch). A closure that takes its batch from a loop outside ``step``
    gives all N evaluations the same batch; ``optex.torch.PointBatches`` gives
    each its own. A closure call that leaves every trainable parameter without
    a gradient (no ``backward()``) raises ValueError. Without
    torch.distributed, the N evaluations run one after the other in this
    process: the trajectory is OptEx's (fewer rounds), the wall-clock speedup
    needs N workers (see below). After ``step``, ``.grad`` holds the gradient
    of the last point this process evaluated.

    **Parameters the engine optimizes.** The parameters with
    ``requires_grad`` form one float32 vector for one engine, in the order
    param groups, then the parameters of each group, each flattened in
    row-major order. float16 and bfloat16 parameters hold the engine's
    float32 values rounded to their dtype (the engine keeps the float32
    master copy); float64 parameters are refused (ValueError: the engine
    computes in float32; use ``model.float()``). All parameters must be on one
    device. As in torch.optim, a parameter is stepped only when it has a
    gradient:

    - a parameter with ``requires_grad=False`` is not in the engine: its value
      and optimizer state do not change (weight decay included);
    - a trainable parameter whose ``.grad`` stays None in every closure call
      of a round (unused by the forward pass) keeps its value and state
      through that round, and the round does not count among its steps;
    - every parameter counts its own steps (``state_dict()["state"][i]["step"]``),
      so a parameter that joins late starts Adam's bias correction afresh.

    When the set of trainable parameters changes (``requires_grad`` switched,
    ``add_param_group`` after the first step), the next ``step`` rebuilds the
    engine over the new set: the parameters that stay keep their values and
    state, a parameter that leaves keeps its state aside (and takes it back
    when it returns), a new one starts from a zero state; the round count
    goes on, and the GP history starts again (its points and gradients live
    in the old vector's space), so the next rounds are warm-up rounds.

    **Param groups.** Each param group has its own hyperparameters (``lr``
    and the others of the chosen optimizer): no weight decay on biases and
    norms, per-layer learning rates. The engine applies them per range of the
    vector (``optex.OptEx`` with a list of (size, optimizer) ranges); every
    group uses the same base optimizer. ``add_param_group`` works at any time
    (see above). A group holds the optimizer's hyperparameters and ``params``;
    a group without parameters, a missing hyperparameter, or an option of
    another optimizer (torch.optim.Adam's ``amsgrad``, ``foreach``, SGD's
    ``dampening``: OptEx would keep and ignore it) raises ValueError naming it:
    at construction and in ``add_param_group``, at the next ``step`` (and
    ``state_dict``) for a key added to or deleted from ``param_groups`` by
    hand, and in ``load_state_dict``. Keys that are no optimizer's option (a
    label such as ``"name"``, ``param_names``, the LR schedulers' bookkeeping)
    are the user's and are kept, as torch.optim keeps them. Values may change
    between steps (below).

    **LR schedulers.** Hyperparameters changed between steps (by a
    ``torch.optim.lr_scheduler``, per group, or by hand) take effect at the
    next ``step``, and the engine keeps its state (moments, step counts,
    history), as ``optex.OptEx.set_optimizer``. A change the engine's state
    cannot follow raises ValueError: momentum switching between zero and
    non-zero (SGD, RMSprop), RMSprop's ``centered``.

    **Buffers.** By default buffers are the model's business: a module that
    updates a buffer in its forward pass (BatchNorm's running statistics in
    training mode) updates it at each of the N closure calls of a round, the
    last call's update last. ``buffers=model`` (a module, or an iterable of
    tensors) instead evaluates every point from the buffers as they were at
    the start of the round and keeps those that the evaluation at the
    committed point left (its first row's, for a point evaluated several
    times): one update per round, from the point the run continues from. A
    round that fails restores them.

    **The iterate belongs to the engine.** The engine is created at the first
    ``step`` from the parameters' values then (so weights loaded after the
    optimizer was constructed are used). Afterwards ``step`` checks that the
    trainable parameters still hold the committed iterate and raises
    RuntimeError if they were changed outside ``step`` (the engine cannot
    adopt a new iterate without losing its history).

    **Checkpoints.** ``state_dict()`` has torch.optim's shape, made of tensors
    and plain values (``torch.load(weights_only=True)`` reads it):
    ``state[i]`` is parameter i's state under torch.optim's names (Adam:
    ``exp_avg``, ``exp_avg_sq``, ``step``), and an ``"optex"`` entry holds the
    engine's iterate, counters, random state, options and GP history.
    ``load_state_dict`` restores it and the run continues bit for bit;
    ``state_dict(history=False)`` leaves the history out (smaller; the resumed
    run warms up again). ``pickle``, ``copy.deepcopy`` and ``torch.save(opt)``
    copy the optimizer with its parameters and continue bit for bit; they
    raise TypeError while a round is pending or under torch.distributed.

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
    hanging. A parameter is unused in a round only if it had no gradient on
    any rank; with ``buffers=``, the rank that evaluated the committed point
    broadcasts its buffers. Pass ``distributed=False`` to let every rank evaluate all N
    points itself (e.g. when the closure's backward already all-reduces, as
    under DistributedDataParallel).

    **Sharded state.** ``shard_state=True`` (under torch.distributed; ZeRO /
    FSDP-style sharding of the optimizer) keeps on each rank only its slice of
    the engine's iterate, optimizer state and GP history: the flat parameter
    vector (the order above) is cut into contiguous runs of whole blocks of
    4096 coordinates, one run per rank in rank order (``optex.shard_of(d, W,
    r)``), and rank r's engine (``optex.OptEx(..., shard=...)``) holds run r,
    so the state's memory per rank is about 1/W of the replicated one's. Every
    sum over all coordinates (the GP's distances and inner products, norms,
    finiteness) is a partial completed across the ranks: an all_gather of the
    float64 partials added in rank order on the CPU, so every rank computes
    the same commit (all_reduce would add in an unspecified order). A round:
    the engine gives the slices of the N points; one all_to_all gives each
    rank the slices of its own rows (the split above), whole; each rank runs
    the closure and its backward pass at its rows; the losses are
    all-gathered; one all_to_all sends each slice of each gradient to the rank
    that owns it (no rank holds more than its own rows' gradients whole); the
    engine commits its slice; one all_gather of the new iterate's slices gives
    every rank the whole iterate, which ``step`` writes into the parameters,
    as without sharding. Per round a rank sends its slice of the points other
    ranks evaluate, the slices of its rows' gradients that other ranks own,
    its slice of the iterate and some kB of sums, in N + 10 collectives (most
    of a few bytes: the sums' all_gathers and the flags' all_reduces). The run
    follows the replicated one (``shard_state=False``) within the C++ sharded
    engine's tolerance (the sums add the same values in another order; tested:
    1e-5 relative, measured 0 over 24 steps), and every rank ends with the same
    parameters. The engine runs on the CPU (a
    ``device`` other than "cpu" is refused); the parameters may live
    anywhere. Refused with ValueError naming ``shard_state``: no initialised
    torch.distributed, ``distributed=False``, fewer trainable elements than
    W blocks of 4096 (some rank would hold nothing), ``proxy="target"``
    (its oracle needs whole points), ranks that disagree on it, and a change
    of the set of trainable parameters after the first step (the slices would
    have to move between ranks). ``state_dict()`` raises RuntimeError after
    the first step and ``load_state_dict`` refuses an optimizer state: a
    checkpoint of sharded state is not available yet (refused rather than
    written with one rank's slice only).

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
        mode: str | None = None,
        tolerance: float | None = None,
        device: str | torch.device | None = None,
        threads: int | None = None,
        history_precision: str | None = None,
        drop_nonfinite: bool = False,
        buffers: Any = None,
        distributed: bool | None = None,
        process_group: Any = None,
        shard_state: bool = False,
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
            "mode": mode,
            "tolerance": tolerance,
            "threads": threads,
            "history_precision": history_precision,
        })
        if device is not None and not isinstance(device, (str, torch.device)):
            raise ValueError(f"device: must be a str, a torch.device or None, got {device!r}")
        self._device: str | None = None if device is None else str(device)
        if not isinstance(drop_nonfinite, bool):
            raise ValueError(f"drop_nonfinite: must be a bool, got {drop_nonfinite!r}")
        self._drop_nonfinite = drop_nonfinite
        self._buffer_tensors = buffers_of(buffers)
        if distributed is not None and not isinstance(distributed, bool):
            raise ValueError(f"distributed: must be a bool or None, got {distributed!r}")
        if distributed and not distributed_available():
            raise ValueError(
                "distributed: True needs an initialised torch.distributed "
                "(torch.distributed.init_process_group)"
            )
        self._distributed_flag = distributed
        self._group = process_group
        self._shard_state = _check_shard_state(shard_state, distributed, device)

        self._engine: _Engine | None = None
        self._shards: Shards | None = None  # shard_state: this rank's slice and the exchanges
        self._iterate: torch.Tensor | None = None  # the committed iterate, float32, on the params' device
        self._layout: FlatLayout | None = None  # the engine's parameters
        self._ranges: list[tuple[int, Any, int]] = []  # the engine's hyperparameters
        self._offsets = StepOffsets()
        self._shelf = Shelf()
        self._scratch: dict[str, torch.Tensor] = {}
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
        first = _hyper.make_optimizer(self._kind, self.param_groups[0], where="")
        on_device = _hyper.options_on(self._options, self._engine_device())
        _Engine(np.zeros(1, np.float32), first, on_device)
        if self._shard_state:
            check_options(first, on_device)
            trainable = sum(p.numel() for params in trainable_groups(self.param_groups) for p in params)
            if trainable:  # checked again at the first step, when the set is final
                slices(trainable, Ranks(self._group, self._param_device()).world)
        if seed is None and options is None:
            # Last, so that a refused construction leaves torch's generator alone.
            self._options.seed = int(torch.empty((), dtype=torch.int64).random_().item())
            self._seed_drawn = True

    # ------------------------------------------------------------------ properties

    @property
    def engine(self) -> _Engine | None:
        """The underlying ``optex.OptEx`` engine (None before the first step), for
        inspection (``iteration``, ``lengthscale``, ``options``...); under
        ``shard_state`` this rank's slice engine (its ``shard`` says which
        coordinates). Calling its ``ask``/``tell`` directly desynchronises this
        optimizer."""
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
        """Adds a param group (torch.optim's contract), with its own hyperparameters
        (the ones it does not set come from the constructor's defaults), at any time.

        Before the first step the group simply joins. After it, the next ``step``
        rebuilds the engine over the larger set of parameters: the parameters
        already there keep their values and optimizer state (moments, step counts),
        the new ones start from their current values with a zero state and their own
        step count from 0 (so Adam's bias correction starts afresh for them, as
        torch.optim's per-parameter state), and the GP history starts again (the
        next rounds are warm-up rounds). ValueError (and no change) for a group
        without parameters, an option of another optimizer (such as torch.optim.Adam's
        ``amsgrad``), a bad hyperparameter, a non-floating, float64 or sparse parameter, a parameter
        on another device, or the same parameter twice."""
        g = len(self.param_groups)
        if isinstance(param_group, dict) and "params" not in param_group:
            raise ValueError(f"param_groups[{g}]: has no 'params'")
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        params = group["params"]
        try:
            if not params:
                raise ValueError(f"param_groups[{g}]['params']: has no parameters (an empty group "
                                 "would optimize nothing)")
            if len(params) != len({id(p) for p in params}):
                raise ValueError(f"param_groups[{g}]: contains the same parameter twice")
            for j, p in enumerate(params):
                _check_parameter(p, f"param_groups[{g}]['params'][{j}]")
            others = [p for group in self.param_groups[:-1] for p in group["params"]]
            first = others[0] if others else (params[0] if params else None)
            for j, p in enumerate(params):
                if first is not None and p.device != first.device:
                    raise ValueError(
                        f"param_groups[{g}]['params'][{j}]: on {p.device}, but the first "
                        f"parameter is on {first.device}; all parameters of an "
                        "optex.torch.OptEx must be on one device"
                    )
            _hyper.make_optimizer(self._kind, group, where=f"param_groups[{g}]: ")
        except ValueError:
            self.param_groups.pop()
            raise

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _param_device(self) -> torch.device:
        return self._params()[0].device

    def _engine_device(self) -> str:
        """The engine's device: the one asked for, else the parameters'; the CPU for
        shard_state."""
        if self._shard_state:
            return "cpu"
        if self._device is not None:
            return self._device
        dev = self._param_device()
        if dev.type == "cuda" and built_with_cuda():
            return f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
        return "cpu"

    def _scratch_tensor(self, name: str, shape: tuple[int, ...], dtype: torch.dtype,
                        device: torch.device) -> torch.Tensor:
        """A cached scratch tensor (pinned host memory when the parameters are on a GPU)."""
        buf = self._scratch.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype or buf.device != device:
            pin = device.type == "cpu" and self._param_device().type == "cuda"
            buf = torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)
            self._scratch[name] = buf
        return buf

    # ------------------------------------------------------------------ the engine

    def _ranks(self) -> Ranks | None:
        """The ranks sharing this step's points; None without torch.distributed."""
        if not distributed_enabled(self._distributed_flag):
            return None
        return Ranks(self._group, self._param_device())

    def _agree(self, ranks: Ranks, ranges: list[tuple[int, Any, int]],
               options: Options, dim: int) -> None:
        ranks.agree(f"{ranges!r}|{_hyper.options_key(options)}|{dim}|{_SHARD_STATE}={self._shard_state}")

    def _trainable_layout(self, groups: list[list[torch.Tensor]]) -> FlatLayout:
        if not any(p.numel() for params in groups for p in params):
            raise ValueError(
                "step: no parameter requires grad (every parameter of every param group has "
                "requires_grad=False or no elements); there is nothing to optimize"
            )
        return FlatLayout(groups)

    def _create_engine(self, groups: list[list[torch.Tensor]], optimizers: list[Any]) -> None:
        """The engine over the trainable parameters, from their values now (rank 0's
        when distributed)."""
        layout = self._trainable_layout(groups)
        options = _hyper.options_on(self._options, self._engine_device())
        ranges = engine_ranges(layout, optimizers, self._offsets)
        x0 = layout.flatten()
        ranks = self._ranks()
        if ranks is not None:
            if self._seed_drawn:
                # Each rank drew its own seed; the run takes rank 0's, as it takes its start.
                seed = torch.tensor([options.seed], dtype=torch.int64)
                options.seed = int(ranks.broadcast_start(seed)[0])
            self._agree(ranks, ranges, options, layout.dim)
            x0 = ranks.broadcast_start(x0)
            layout.write(x0)
        if self._shard_state:
            assert ranks is not None  # shard_state needs torch.distributed (checked at construction)
            self._shards = Shards(ranks, layout.dim)
            self._engine = self._shards.engine(x0, ranges, options)
        else:
            self._engine = _Engine(x0.cpu().numpy(), engine_optimizer(ranges), options)
        self._options.seed = options.seed
        self._layout, self._ranges, self._iterate = layout, ranges, x0

    def _rebuild_engine(self, groups: list[list[torch.Tensor]], optimizers: list[Any]) -> None:
        """The set of trainable parameters changed (add_param_group, requires_grad):
        a new engine over the new set (trainable.rebuild_state)."""
        assert self._engine is not None and self._layout is not None
        new = self._trainable_layout(groups)
        ranks = self._ranks()
        if ranks is not None:  # the parameters that join take rank 0's values
            new.write(ranks.broadcast_start(new.flatten()))
        state = rebuild_state(self._engine.state_arrays(history=False), self._layout, new,
                              self._offsets, self._shelf)
        ranges = engine_ranges(new, optimizers, self._offsets)
        if ranks is not None:
            self._agree(ranks, ranges, self._engine.options, new.dim)
        state["optimizer"] = range_entries(ranges)
        self._engine = _Engine.from_state_arrays(state, device=self._engine_device())
        self._layout, self._ranges = new, ranges
        self._iterate = torch.from_numpy(state["x"]).to(new.device)

    def _follow_schedule(self, ranges: list[tuple[int, Any, int]]) -> None:
        """The groups' hyperparameters (an LR scheduler) or the step offsets changed
        since the last step: the engine takes them and keeps its state."""
        assert self._engine is not None and self._layout is not None
        ranks = self._ranks()
        if ranks is not None:
            self._agree(ranks, ranges, self._engine.options, self._layout.dim)
        # The engine's own ranges: this rank's slice of them under shard_state.
        shards = self._shards
        mine = ranges if shards is None else shards.cut(ranges)
        before = self._ranges if shards is None else shards.cut(self._ranges)
        engine, refused = self._engine, None
        try:
            if [r[0] for r in mine] != [r[0] for r in before]:
                # Ranges split or merged (a parameter's step offset moved away from its
                # neighbours'): set_optimizer keeps the ranges' sizes, so the engine is
                # rebuilt from its whole state, history included, with the new ranges.
                state = engine.state_arrays()
                state["optimizer"] = range_entries(mine)
                engine = (_Engine.from_state_arrays(state, device=self._engine_device())
                          if shards is None else shards.engine_from_state(state))
            else:
                engine.set_optimizer(engine_optimizer(mine))
        except ValueError as error:
            refused = error
        # Under shard_state each rank checked only its slice (and some ranks may have
        # rebuilt while others did not): the ranks agree on the outcome, and where one
        # refused, every rank keeps the values it had.
        if shards is not None and shards.ranks.any_rank([refused is not None])[0] and refused is None:
            if engine is self._engine:
                engine.set_optimizer(engine_optimizer(before))
            refused = ValueError("another rank's slice of the parameters refused them")
        if refused is not None:
            raise ValueError(
                f"step: the hyperparameters changed to {ranges!r}, which the running engine "
                f"({self._engine.optimizer!r}) cannot take: {refused}"
            ) from None
        self._engine = engine
        self._ranges = ranges

    def _prepare_engine(self) -> None:
        """Before a round: the engine exists, optimizes the trainable parameters, and
        has the groups' current hyperparameters."""
        optimizers = _hyper.group_optimizers(self._kind, self.param_groups)
        groups = trainable_groups(self.param_groups)
        if self._engine is None:
            self._create_engine(groups, optimizers)
            return
        assert self._layout is not None and self._iterate is not None
        # A parameter leaving the engine (frozen now) may have been changed meanwhile.
        trainable = {id(p) for params in groups for p in params}
        self._layout.check_holds(self._iterate, skip=lambda p: id(p) not in trainable)
        if not same_parameters(self._layout, groups):
            if self._shards is not None:
                raise ValueError(
                    f"step: the set of trainable parameters changed since the first step "
                    f"(add_param_group, requires_grad), which {_SHARD_STATE}=True does not support "
                    "yet: its ranks' slices of the state would have to move; keep the set fixed, "
                    "or construct a new optimizer"
                )
            self._rebuild_engine(groups, optimizers)
        assert self._layout is not None
        ranges = engine_ranges(self._layout, optimizers, self._offsets)
        if ranges != self._ranges:
            self._follow_schedule(ranges)

    def _oracle(self, closure: Closure, seed: int, row: int, x: np.ndarray) -> tuple[float, np.ndarray]:
        """The true gradient for proxy='target', called by the engine inside ask()
        (`seed`: the run's seed; `row`: the first batch row of the point `x`)."""
        assert self._layout is not None
        point = torch.from_numpy(x).to(self._layout.device)
        grad = torch.empty_like(point)
        self._current_point, self._current_seed, self._current_oracle_row = None, seed, row
        try:
            _, loss, _ = evaluate(closure, self._layout, point, grad)
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

        Raises ValueError without a closure, when the closure returns no scalar
        loss, or when a closure call leaves every trainable parameter without a
        gradient (it did not call ``backward()``); RuntimeError when the
        parameters were changed since the last step. If the closure raises, the
        parameters (and the ``buffers=``) are restored and the round stays
        pending: the next ``step`` evaluates the same points.
        """
        check_closure(closure)
        if isinstance(closure, BatchedClosure):
            closure._bind_to(self)  # its sequential form evaluates this optimizer's current_point
        self._prepare_engine()
        engine, layout = self._engine, self._layout
        assert engine is not None and layout is not None and self._iterate is not None
        n, d = engine.parallelism, layout.dim
        dev = layout.device
        shards = self._shards

        # The engine's own point and gradient rows, wrapped without a copy
        # (DLPack): on a CUDA engine they stay in GPU memory. Under shard_state
        # they are this rank's (N, size) slices.
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

        # This process's points (`block`, the rows `mine`), and where their gradients
        # and losses go: alone, straight into the engine's rows; under
        # torch.distributed, into buffers that the ranks then exchange.
        ranks = self._ranks()
        if ranks is None:
            mine, block, grads_local = range(n), points, rows
            losses_local = torch.zeros(n, dtype=torch.float64)
        else:
            mine, width = ranks.points(n), ranks.width(n)
            block = points[mine.start:mine.stop] if shards is None else shards.whole_points(points, n)
            grads_local = self._scratch_tensor("grads_local", (width, d), torch.float32, ranks.device)
            losses_local = ranks.losses_buffer(width)
        batched = isinstance(closure, BatchedClosure) and closure.vectorize
        # Under vmap no evaluation can update a buffer in place (BatchedClosure refuses
        # such models), so there is nothing to keep.
        buffers = (CommittedBuffers(self._buffer_tensors)
                   if self._buffer_tensors is not None and not batched else None)
        try:
            results, got_gradient, failure = self._evaluate(
                closure, batched, block, seeds, mine, grads_local, losses_local, ranks, buffers)
            if ranks is None:
                losses = losses_local
            elif shards is None:
                losses = ranks.gather(grads_local, losses_local, rows, failure)
            else:
                losses = ranks.gather_losses(losses_local, n, failure)
                shards.send_gradients(grads_local, rows, n)
            if ranks is not None:
                got_gradient = ranks.any_rank(got_gradient)
            if rows.device.type == "cuda":
                torch.cuda.synchronize(rows.device)  # the engine reads the rows on its own stream
            # torch.optim skips a parameter without a gradient: the commit leaves its
            # value and state alone, and the round does not count among its steps.
            unused = [p for p, got in zip(layout.params, got_gradient) if not got]
            unchanged = merged_segments(layout, [not got for got in got_gradient])
            if shards is not None:
                unchanged = shards.local_ranges(unchanged)
            steps_before = engine.optimizer_step
            info = engine.tell_device(losses.numpy(), drop_nonfinite=self._drop_nonfinite,
                                      unchanged=unchanged)
        except BaseException:
            if buffers is not None:
                buffers.restore_start()
            raise
        self._offsets.skip(unused, engine.optimizer_step - steps_before)
        self._last_info = info
        self._iteration = int(engine.iteration)

        # A copy: the engine rewrites its iterate in place at the next commit.
        if shards is None:
            self._iterate = torch.from_dlpack(engine.device_x()).to(dev, copy=True)
        else:
            self._iterate = shards.whole_iterate(torch.from_dlpack(engine.device_x())).to(dev)
        layout.write(self._iterate)
        committed = committed_rows(info.committed_point, info.point_evaluations)
        if buffers is not None:
            buffers.keep(committed.start, n, ranks)
        return loss_at(committed, info.loss, results, losses)

    def _evaluate(self, closure: Closure, batched: bool, points: torch.Tensor, seeds: Any,
                  mine: range, grads_local: torch.Tensor, losses_local: torch.Tensor,
                  ranks: Ranks | None, buffers: CommittedBuffers | None
                  ) -> tuple[dict[int, Any], list[bool], BaseException | None]:
        """Evaluates the closure at this process's points ``mine`` (``points[k]`` is row
        ``mine[k]``, whole) into ``grads_local``
        and ``losses_local``; returns (the closure's values by row, per trainable
        parameter whether any call gave it a gradient, the error a closure raised
        under torch.distributed, which the gather reports to every rank). The
        parameters hold the iterate again afterwards."""
        layout = self._layout
        assert layout is not None and self._iterate is not None
        dev, d = layout.device, layout.dim
        # The closure needs its point, and gives its gradient, on the parameters' device.
        scratch_point = (self._scratch_tensor("point", (d,), torch.float32, dev)
                         if points.device != dev else None)
        scratch_grad = (self._scratch_tensor("grad", (d,), torch.float32, dev)
                        if grads_local.device != dev else None)
        results: dict[int, Any] = {}
        got_gradient = [False] * len(layout.params)
        try:
            if batched:
                # batched.py: all of this process's rows in one vectorized call, not one
                # by one; every trainable parameter gets a gradient (zeros where unused).
                try:
                    results = closure.evaluate_rows(layout, points, mine, grads_local, losses_local)
                except Exception as error:
                    if ranks is None:
                        raise
                    ranks.flag_failure(losses_local, mine.start)
                    return results, got_gradient, error
                return results, [True] * len(layout.params), None
            for k, i in enumerate(mine):
                point = points[k] if scratch_point is None else scratch_point.copy_(points[k])
                out = grads_local[k] if scratch_grad is None else scratch_grad
                self._current_point, self._current_seed = i, int(seeds[i])
                if buffers is not None:
                    buffers.before_evaluation()
                try:
                    results[i], losses_local[k], had = evaluate(closure, layout, point, out)
                except Exception as error:
                    if ranks is None:
                        raise
                    # The other ranks must learn of it in the gather, not hang in it.
                    ranks.flag_failure(losses_local, i)
                    return results, got_gradient, error
                got_gradient = [a or b for a, b in zip(got_gradient, had)]
                if buffers is not None:
                    buffers.after_evaluation(i)
                if scratch_grad is not None:
                    grads_local[k].copy_(scratch_grad)
            return results, got_gradient, None
        finally:
            self._current_point = self._current_seed = None
            layout.write(self._iterate)

    # ------------------------------------------------------------------ pickle, deepcopy, torch.save

    def __reduce_ex__(self, protocol: Any) -> tuple:
        """pickle, ``copy.deepcopy`` and ``torch.save(opt)``: the copy is this
        optimizer rebuilt from its constructor settings, its param groups (the
        parameter tensors as pickle copies them: shared with a model copied in the
        same call, as torch.optim) and ``state_dict()``, so it continues bit for bit.
        TypeError, naming ``state_dict()``, where that cannot hold: a pending round,
        or an optimizer sharing its rounds over torch.distributed (its process
        group does not travel)."""
        if distributed_enabled(self._distributed_flag) or self._group is not None:
            raise TypeError(
                "optex.torch.OptEx: an optimizer that shares its rounds over torch.distributed "
                "cannot be pickled or deep-copied (its process group does not travel); save "
                "opt.state_dict() and load it into an optimizer built on the other side"
            )
        if self._engine is not None and self._engine.pending:
            raise TypeError(
                "optex.torch.OptEx: cannot be pickled or deep-copied while a round is pending "
                "(the last step failed mid-round); call step(closure) to finish it, or save "
                "opt.state_dict() afterwards"
            )
        settings = {
            "optimizer": self._kind,
            "defaults": dict(self.defaults),
            "options": {name: getattr(self._options, name) for name in _hyper.OPTION_FIELDS},
            "device": self._device,
            "drop_nonfinite": self._drop_nonfinite,
            "buffers": self._buffer_tensors,
            "distributed": self._distributed_flag,
        }
        return (_restore, (self.param_groups, settings, self.state_dict()))

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self, *, history: bool = True) -> dict[str, Any]:
        """torch.optim's ``{"state": ..., "param_groups": ...}`` plus an ``"optex"``
        entry, all tensors and plain values (``torch.load(weights_only=True)``
        reads it; layout in optex/torch/checkpoint.py). ``state[i]`` is parameter
        i's optimizer state under torch.optim's names (Adam: ``exp_avg``,
        ``exp_avg_sq``, ``step``), for every parameter that has one; ``"optex"``
        holds the engine's iterate, counters, random state, options and GP
        history. Empty state before the first step.

        ``history=False`` leaves the GP history out: the file shrinks by
        2 x history x d floats, and a run resumed from it keeps the iterate,
        the optimizer state, the counters and the random state but starts its
        history afresh (warm-up rounds again), so it is not the same run as
        the uninterrupted one. The default resumes bit for bit.
        RuntimeError while a round is pending (a step failed mid-round); ValueError
        for param groups changed by hand into what load_state_dict refuses (a key
        deleted or added, an invalid hyperparameter)."""
        if not isinstance(history, bool):
            raise ValueError(f"history: must be a bool, got {history!r}")
        try:  # param groups changed by hand: refused here rather than written unloadable
            _hyper.group_optimizers(self._kind, self.param_groups)
        except ValueError as error:
            raise ValueError(f"state_dict: {error} (load_state_dict would refuse it)") from None
        result = super().state_dict()
        if self._engine is None:
            return result
        if self._shards is not None:
            raise RuntimeError(
                f"state_dict: {_SHARD_STATE}=True: each rank holds only its slice of the "
                "optimizer state and the history, and a state_dict of sharded state is not "
                "available yet (it is refused rather than written incomplete); checkpoint the "
                "model's parameters, or train with shard_state=False where a checkpoint is needed"
            )
        if self._engine.pending:
            raise RuntimeError(
                "state_dict: the last step failed mid-round and its round is still pending; "
                "call step(closure) again to finish it before saving"
            )
        assert self._layout is not None
        state, optex_part = _checkpoint.save(self._engine, self._kind, self._layout, self._params(),
                                             self._offsets, self._shelf, history)
        result["state"] = state
        result[_checkpoint.KEY] = optex_part
        return result

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a ``state_dict()`` (torch.optim's contract: the param groups must
        match in number and sizes). The engine resumes on this optimizer's device
        and the run continues bit for bit (without the history if it was left
        out). The parameters are not changed: they must hold the checkpoint's
        iterate at the next step (load the model's matching state_dict).

        Only a state that an optex.torch.OptEx of this optimizer kind over
        parameters of these shapes could have written loads (state_dict_checks.py):
        ValueError, naming the entry, and nothing changed (param groups, state,
        engine, counters) for anything else: another optimizer's state (a
        torch.optim optimizer's, even before its first step), a param-group key
        that is another optimizer's option, an invalid hyperparameter, malformed tensors
        (wrong shape, dtype or layout, meta tensors), non-finite values, or a
        state from which the engine cannot take a step."""
        _checks.check_top(state_dict, _checkpoint.KEY)
        groups, state = state_dict[_checks.GROUPS], state_dict[_checks.STATE]
        first = state.get(0)
        blob = isinstance(first, dict) and _CHECKPOINT_KEY in first
        if state and not blob and not _checkpoint.is_optex_state(state_dict):
            raise ValueError(
                "state_dict: not an optex.torch.OptEx state (it has a 'state' but no "
                f"'{_checkpoint.KEY}' entry: a torch.optim optimizer's?)"
            )
        _checks.check_param_groups(self._kind, groups, self.param_groups)
        if self._shard_state and (state or _checkpoint.is_optex_state(state_dict)):
            raise ValueError(
                f"state_dict: {_SHARD_STATE}=True cannot load an optimizer state yet (its ranks "
                "would each need their slice of it); only a state saved before the first step "
                "(without one) loads"
            )
        if blob:
            self._load_engine_blob(state_dict)
            return
        # torch.optim's own checks and param groups first; put back unless
        # everything loads, so that a refused state changes nothing.
        old_groups, old_state, old_defaults = self.param_groups, self.state, dict(self.defaults)
        self._torch_load_groups(groups)
        new_groups = self.param_groups
        try:
            engine, layout, offsets, shelf, ranges = self._engine_from_state(state_dict, new_groups)
        except BaseException:
            self.param_groups, self.state = old_groups, old_state
            self.defaults.clear()
            self.defaults.update(old_defaults)
            raise
        self.state.clear()
        self._engine, self._layout, self._last_info = engine, layout, None
        self._iteration = 0 if engine is None else int(engine.iteration)
        self._offsets, self._shelf = offsets, shelf
        if engine is None or layout is None:
            self._iterate, self._ranges = None, []
            return
        self._ranges = ranges
        self._options = engine.options
        self._iterate = torch.from_numpy(engine.x).to(layout.device)

    def _torch_load_groups(self, groups: list[dict[str, Any]]) -> None:
        """torch.optim's load of the (checked) param groups, with an empty state. Its
        ``__setstate__`` adds "differentiable" to the defaults, which add_param_group
        would then copy into every later group: OptEx keeps its defaults as they were."""
        defaults = dict(self.defaults)
        super().load_state_dict({"state": {}, "param_groups": groups})
        self.defaults.clear()
        self.defaults.update(defaults)

    def _engine_from_state(self, state_dict: dict[str, Any], groups: list[dict[str, Any]]) -> tuple:
        """(engine, layout, offsets, shelf, ranges) of a state_dict() (Nones and empties
        for a state saved before the first step); ValueError for a malformed one."""
        offsets, shelf = StepOffsets(), Shelf()
        if not _checkpoint.is_optex_state(state_dict):
            return None, None, offsets, shelf, []
        state = state_dict["state"]
        params = [p for group in groups for p in group["params"]]
        optex_part = state_dict[_checkpoint.KEY]
        indices = _checkpoint.trainable_indices(optex_part, len(params), self._kind)
        chosen = set(indices)
        layout = FlatLayout([[p for p, i in zip(group["params"], indices_of) if i in chosen]
                             for group, indices_of in _indexed(groups)])
        arrays, own_steps = _checkpoint.engine_arrays(optex_part, state, layout, params)
        for p in layout.params:
            offsets.set(p, int(arrays["step"]) - own_steps[id(p)])
        ranges = engine_ranges(layout, _hyper.group_optimizers(self._kind, groups), offsets)
        arrays["optimizer"] = range_entries(ranges)
        try:
            engine = _Engine.from_state_arrays(arrays, device=self._engine_device())
        except (ValueError, TypeError, OverflowError) as error:
            raise ValueError(f"state_dict: {error}") from None
        step = int(arrays["step"])
        for p, slots, own in _checkpoint.shelved_states(state, chosen, params, list(arrays["slots"]), step):
            _checks.check_shelved(arrays, groups, p, slots, step - own, self._kind)
            shelf.put(p, slots, own)
        return engine, layout, offsets, shelf, ranges

    def _load_engine_blob(self, state_dict: dict[str, Any]) -> None:
        """The earlier state_dict format: one engine checkpoint (bytes) for all parameters."""
        entry = state_dict["state"].get(0)
        if len(state_dict["state"]) != 1 or not isinstance(entry.get(_CHECKPOINT_KEY), (bytes, bytearray)):
            raise ValueError(
                "state_dict: not an optex.torch.OptEx state (expected 'state' to be empty "
                f"or {{0: {{'{_CHECKPOINT_KEY}': bytes, ...}}}}, got keys {list(state_dict['state'])})"
            )
        engine = _engine_from_bytes(bytes(entry[_CHECKPOINT_KEY]), self._engine_device())
        kind = _hyper.kind_of(engine.optimizer)
        if kind != self._kind:
            raise ValueError(
                f"state_dict: saved with optimizer={kind!r}, this optimizer has optimizer={self._kind!r}"
            )
        layout = FlatLayout([group["params"] for group in self.param_groups])
        if engine.dim != layout.dim:
            raise ValueError(
                f"state_dict: the checkpoint is for {engine.dim} parameters, this optimizer has {layout.dim}"
            )
        self._torch_load_groups(state_dict["param_groups"])
        self.state.clear()
        self._engine, self._layout, self._last_info = engine, layout, None
        self._offsets, self._shelf = StepOffsets(), Shelf()
        self._iteration = int(engine.iteration)
        self._ranges = engine_ranges(layout, _hyper.group_optimizers(self._kind, self.param_groups),
                                     self._offsets)
        self._options = engine.options
        self._iterate = torch.from_numpy(engine.x).to(layout.device)


# The earlier state_dict format held an engine checkpoint file's bytes.

def _engine_from_bytes(blob: bytes, device: str) -> _Engine:
    with tempfile.TemporaryDirectory(prefix="optex-") as tmp:
        path = os.path.join(tmp, "engine.ckpt")
        with open(path, "wb") as f:
            f.write(blob)
        try:
            return _Engine.load(path, device=device)
        except RuntimeError as error:
            raise ValueError(f"state_dict: the engine checkpoint cannot be read: {error}") from None


def _indexed(groups: list[dict[str, Any]]) -> list[tuple[dict[str, Any], range]]:
    """Each param group with the state_dict indices of its parameters."""
    out, start = [], 0
    for group in groups:
        count = len(group["params"])
        out.append((group, range(start, start + count)))
        start += count
    return out


def _restore(param_groups: list[dict[str, Any]], settings: dict[str, Any],
             state: dict[str, Any]) -> OptEx:
    """The other half of OptEx.__reduce_ex__."""
    defaults = dict(settings["defaults"])
    lr = defaults.pop("lr")
    opt = OptEx(param_groups, settings["optimizer"], lr, options=Options(**settings["options"]),
                device=settings["device"], drop_nonfinite=settings["drop_nonfinite"],
                buffers=settings["buffers"], distributed=settings["distributed"], **defaults)
    opt.load_state_dict(state)
    return opt
