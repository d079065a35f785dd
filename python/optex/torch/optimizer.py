"""``optex.torch.OptEx``: the ``torch.optim.Optimizer`` facade over the engine ``optex.OptEx``.

The facade owns the torch.optim side (param groups, ``step(closure)``,
``state_dict``), the optimizer's fields and the engine's lifetime; its methods
hand the work to the other modules of optex.torch: argument_checks.py (the
constructor's and add_param_group's arguments), hyperparameters.py (torch.optim's
names -> the engine's values), engine_lifecycle.py (the engine created, rebuilt
and kept on schedule), step.py (one round), layout.py (parameters <-> the flat
vector), closure.py (calling the closure at a point), exchange.py
(torch.distributed), state_dict.py (state_dict and load_state_dict) and
pickling.py (pickle, deepcopy, torch.save).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Union

import torch

from .._optex import IterationInfo, Options, built_with_cuda
from .._optex import OptEx as _Engine
from . import argument_checks as _args
from . import hyperparameters as _hyper
from . import pickling as _pickling
from . import state_dict as _state_dict
from . import step as _step
from .closure import Closure
from .committed_buffers import buffers_of
from .exchange import Ranks, Replicas, distributed_enabled, replicas_enabled
from .layout import FlatLayout
from .sharded import Shards
from .trainable import Shelf, StepOffsets

ParamsT = Union[Iterable[torch.Tensor], Iterable[dict[str, Any]]]


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
    ``proxy``, ``proxy_distances``, ``seed``, ``evaluations_per_point``, ``strategy``,
    ``continue_from``, ``max_posterior_variance``, ``trust_region``,
    ``max_lengthscale_change``, ``mode`` and ``tolerance`` (``mode="verified"``:
    the base optimizer's own trajectory, several of its steps a round; see
    ``optex.Options.verified``; a round's commit ends before the first point
    whose parameters with a gradient differ from the iterate's, so a parameter
    that joins or leaves mid-run does so at torch.optim's step, bit for bit), ``device``, ``threads`` (the CPU's passes over
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
    unless points were dropped or ``continue_from`` is "best_loss"): a copy,
    detached, of the tensor the closure returned there (or the number); for a
    point evaluated several times, the mean of its losses (``last_info.loss``)
    as a 0-dim tensor. What the closure hands back is taken when it returns:
    the gradients are copied out of ``.grad`` (set to None before each call,
    never written into) and the loss is read and copied, so a closure that
    writes its loss or gradients into buffers it reuses, or keeps the tensors
    it produced, gives the round a closure of fresh tensors gives (the copies
    cost one d-sized copy per call, as reading the gradients always did). The
    parameters themselves are the model's, rewritten at each point: keep a
    ``.clone()`` to keep a point's values. While the closure runs, :attr:`current_point` and
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
    non-zero (SGD, RMSprop), RMSprop's ``centered``. The bounds are
    torch.optim's: an ``lr`` of exactly 0 (where a ``LambdaLR`` warmup starts
    and ``CosineAnnealingLR(eta_min=0)`` arrives) is taken, and its round
    evaluates the N gradients, leaves the parameters bit for bit and advances
    the state as torch.optim's step at lr 0 does; a negative, NaN or infinite
    value raises ValueError naming the group and the key, with nothing changed.

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
    raise TypeError while a round is pending or while the optimizer shares its
    rounds over torch.distributed (with ``distributed=False`` it may be copied).

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
    hanging, and so does a step that one rank refuses before its round
    (parameters changed outside ``step``, an invalid hyperparameter): that rank
    raises its own error, the others RuntimeError, and nothing changes on any
    rank (one all_reduce of a flag per step). A parameter is unused in a round only if it had no gradient on
    any rank; with ``buffers=``, the rank that evaluated the committed point
    broadcasts its buffers.

    **DistributedDataParallel: distributed=False.** Under DDP, whose backward
    averages the gradients over the ranks, pass ``distributed=False``: every
    rank evaluates all N points itself, each on its own share of the batch.
    The ranks still commit the same iterate every round, bit for bit: before
    ``tell`` they exchange (one small all_gather) each point's loss, a checksum
    of each gradient and which parameters received one, and every rank tells
    its engine the losses' mean over the ranks (added in rank order; as DDP
    averages the gradients), so the committed point, the dropped non-finite
    points, the adaptive strategy's and the verified mode's decisions are the
    same everywhere; a parameter has a gradient where it has one on any rank.
    As with shared rounds, the ranks take rank 0's seed, start point and
    (``buffers=``) committed buffers, check that they agree on the settings,
    and a closure that raises on one rank makes every rank raise RuntimeError.
    Gradients that differ between the ranks (a model not wrapped in DDP) raise
    RuntimeError on every rank, naming the point, before anything changes (the
    round stays pending): wrap the model in DDP, pass ``distributed=True`` to
    share the points instead, or pass ``process_group`` a group of this rank
    alone (``dist.new_group([rank])``) for independent runs. ``last_info.loss``
    is then the mean; ``step`` returns this rank's own loss.

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
        proxy_distances: str | None = None,
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
            "proxy_distances": proxy_distances,
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
        self._device: str | None = _args.check_device(device)
        self._drop_nonfinite = _args.check_drop_nonfinite(drop_nonfinite)
        self._buffer_tensors = buffers_of(buffers)
        self._distributed_flag = _args.check_distributed(distributed)
        self._group = process_group
        self._shard_state = _args.check_shard_state(shard_state, distributed, device)

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
        _args.check_construction(self)
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
        try:
            _args.check_added_group(self._kind, self.param_groups, g)
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

    # ------------------------------------------------------------------ the engine

    def _ranks(self) -> Ranks | None:
        """The ranks sharing this step's points; None without torch.distributed."""
        if not distributed_enabled(self._distributed_flag):
            return None
        return Ranks(self._group, self._param_device())

    def _replicas(self) -> Replicas | None:
        """The ranks that replicate this step's rounds (``distributed=False`` under
        torch.distributed, as under DistributedDataParallel); None otherwise."""
        if not replicas_enabled(self._distributed_flag, self._group):
            return None
        return Replicas(self._group, self._param_device())

    def _peers(self) -> Ranks | None:
        """The ranks whose engines must stay identical: sharing or replicating."""
        ranks = self._ranks()
        return ranks if ranks is not None else self._replicas()

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
        return _step.run(self, closure)

    # ------------------------------------------------------------------ pickle, deepcopy, torch.save

    def __reduce_ex__(self, protocol: Any) -> tuple:
        """pickle, ``copy.deepcopy`` and ``torch.save(opt)``: the copy is this
        optimizer rebuilt from its constructor settings, its param groups (the
        parameter tensors as pickle copies them: shared with a model copied in the
        same call, as torch.optim) and ``state_dict()``, so it continues bit for bit.
        TypeError, naming ``state_dict()``, where that cannot hold: a pending round,
        or an optimizer sharing its rounds over torch.distributed (its process
        group does not travel)."""
        settings = _pickling.settings(self)
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
        _state_dict.check_save(self, history)
        return _state_dict.with_engine_state(self, super().state_dict(), history)

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
        _state_dict.load(self, state_dict)

    def _torch_load_groups(self, groups: list[dict[str, Any]]) -> None:
        """torch.optim's load of the (checked) param groups, with an empty state. Its
        ``__setstate__`` adds "differentiable" to the defaults, which add_param_group
        would then copy into every later group: OptEx keeps its defaults as they were."""
        defaults = dict(self.defaults)
        super().load_state_dict({"state": {}, "param_groups": groups})
        self.defaults.clear()
        self.defaults.update(defaults)


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
