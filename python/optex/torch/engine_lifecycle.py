"""The engine under ``optex.torch.OptEx``: created, rebuilt and kept on schedule.

The engine is created at the first ``step`` over the trainable parameters (from
their values then: rank 0's under torch.distributed). Before each later round
``prepare`` keeps it in line with the param groups: a new engine when the set
of trainable parameters changed (trainable.py's rebuild_state carries the state
over), ``set_optimizer`` (or a rebuild with new ranges) when the hyperparameters
or the step offsets changed, as an LR scheduler changes them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from .._optex import Options
from .._optex import OptEx as _Engine
from . import hyperparameters as _hyper
from .exchange import Ranks
from .layout import FlatLayout
from .sharded import OPTION as _SHARD_STATE
from .sharded import Shards
from .trainable import (engine_optimizer, engine_ranges, range_entries, rebuild_state,
                        same_parameters, trainable_groups)

if TYPE_CHECKING:
    from .optimizer import OptEx


def _agree(opt: OptEx, ranks: Ranks, ranges: list[tuple[int, Any, int]],
           options: Options, dim: int) -> None:
    ranks.agree(f"{ranges!r}|{_hyper.options_key(options)}|{dim}|{_SHARD_STATE}={opt._shard_state}")


def _trainable_layout(groups: list[list[torch.Tensor]]) -> FlatLayout:
    if not any(p.numel() for params in groups for p in params):
        raise ValueError(
            "step: no parameter requires grad (every parameter of every param group has "
            "requires_grad=False or no elements); there is nothing to optimize"
        )
    return FlatLayout(groups)


def _create_engine(opt: OptEx, groups: list[list[torch.Tensor]], optimizers: list[Any]) -> None:
    """The engine over the trainable parameters, from their values now (rank 0's
    when distributed)."""
    layout = _trainable_layout(groups)
    options = _hyper.options_on(opt._options, opt._engine_device())
    ranges = engine_ranges(layout, optimizers, opt._offsets)
    x0 = layout.flatten()
    ranks = opt._peers()  # sharing the rounds, or replicating them (distributed=False)
    if ranks is not None:
        if opt._seed_drawn:
            # Each rank drew its own seed; the run takes rank 0's, as it takes its start.
            seed = torch.tensor([options.seed], dtype=torch.int64)
            options.seed = int(ranks.broadcast_start(seed)[0])
        _agree(opt, ranks, ranges, options, layout.dim)
        x0 = ranks.broadcast_start(x0)
        layout.write(x0)
    if opt._shard_state:
        assert ranks is not None  # shard_state needs torch.distributed (checked at construction)
        opt._shards = Shards(ranks, layout.dim)
        opt._engine = opt._shards.engine(x0, ranges, options)
    else:
        opt._engine = _Engine(x0.cpu().numpy(), engine_optimizer(ranges), options)
    opt._options.seed = options.seed
    opt._layout, opt._ranges, opt._iterate = layout, ranges, x0


def _rebuild_engine(opt: OptEx, groups: list[list[torch.Tensor]], optimizers: list[Any]) -> None:
    """The set of trainable parameters changed (add_param_group, requires_grad):
    a new engine over the new set (trainable.rebuild_state)."""
    assert opt._engine is not None and opt._layout is not None
    new = _trainable_layout(groups)
    ranks = opt._peers()
    if ranks is not None:  # the parameters that join take rank 0's values
        new.write(ranks.broadcast_start(new.flatten()))
    state = rebuild_state(opt._engine.state_arrays(history=False), opt._layout, new,
                          opt._offsets, opt._shelf)
    ranges = engine_ranges(new, optimizers, opt._offsets)
    if ranks is not None:
        _agree(opt, ranks, ranges, opt._engine.options, new.dim)
    state["optimizer"] = range_entries(ranges)
    opt._engine = _Engine.from_state_arrays(state, device=opt._engine_device())
    opt._layout, opt._ranges = new, ranges
    opt._iterate = torch.from_numpy(state["x"]).to(new.device)


def _follow_schedule(opt: OptEx, ranges: list[tuple[int, Any, int]]) -> None:
    """The groups' hyperparameters (an LR scheduler) or the step offsets changed
    since the last step: the engine takes them and keeps its state."""
    assert opt._engine is not None and opt._layout is not None
    ranks = opt._peers()
    if ranks is not None:
        _agree(opt, ranks, ranges, opt._engine.options, opt._layout.dim)
    # The engine's own ranges: this rank's slice of them under shard_state.
    shards = opt._shards
    mine = ranges if shards is None else shards.cut(ranges)
    before = opt._ranges if shards is None else shards.cut(opt._ranges)
    engine, refused = opt._engine, None
    try:
        if [r[0] for r in mine] != [r[0] for r in before]:
            # Ranges split or merged (a parameter's step offset moved away from its
            # neighbours'): set_optimizer keeps the ranges' sizes, so the engine is
            # rebuilt from its whole state, history included, with the new ranges.
            state = engine.state_arrays()
            state["optimizer"] = range_entries(mine)
            engine = (_Engine.from_state_arrays(state, device=opt._engine_device())
                      if shards is None else shards.engine_from_state(state))
        else:
            engine.set_optimizer(engine_optimizer(mine))
    except ValueError as error:
        refused = error
    # Under shard_state each rank checked only its slice (and some ranks may have
    # rebuilt while others did not): the ranks agree on the outcome, and where one
    # refused, every rank keeps the values it had.
    if shards is not None and shards.ranks.any_rank([refused is not None])[0] and refused is None:
        if engine is opt._engine:
            engine.set_optimizer(engine_optimizer(before))
        refused = ValueError("another rank's slice of the parameters refused them")
    if refused is not None:
        raise ValueError(
            f"step: the hyperparameters changed to {ranges!r}, which the running engine "
            f"({opt._engine.optimizer!r}) cannot take: {refused}"
        ) from None
    opt._engine = engine
    opt._ranges = ranges


def _local_checks(opt: OptEx) -> tuple[list[Any], list[list[torch.Tensor]]]:
    """The checks each rank makes on its own before a round: the groups'
    hyperparameters, and after the first step that the parameters still hold the
    iterate. Returns (the groups' optimizers, the trainable parameters by group)."""
    optimizers = _hyper.group_optimizers(opt._kind, opt.param_groups)
    groups = trainable_groups(opt.param_groups)
    if opt._engine is not None:
        assert opt._layout is not None and opt._iterate is not None
        # A parameter leaving the engine (frozen now) may have been changed meanwhile.
        trainable = {id(p) for params in groups for p in params}
        opt._layout.check_holds(opt._iterate, skip=lambda p: id(p) not in trainable)
    return optimizers, groups


def _checked_on_every_rank(opt: OptEx) -> tuple[list[Any], list[list[torch.Tensor]]]:
    """_local_checks, agreed between the ranks (one all_reduce of a flag): a rank
    that refuses the step alone would leave the others waiting in the round's
    first collective, so when one refuses, every rank raises before any exchange
    (its own error, or RuntimeError saying that another rank refused)."""
    peers = opt._peers()
    try:
        checked = _local_checks(opt)
    except (ValueError, RuntimeError):
        if peers is not None:
            peers.any_rank([True])
        raise
    if peers is not None and peers.any_rank([False])[0]:
        raise RuntimeError(
            "step: another rank refused this step before the round began (its parameters were "
            "changed outside step, or its param groups hold an invalid hyperparameter; its "
            "error says which); every rank refuses it and nothing changed")
    return checked


def prepare(opt: OptEx) -> None:
    """Before a round: the engine exists, optimizes the trainable parameters, and
    has the groups' current hyperparameters."""
    optimizers, groups = _checked_on_every_rank(opt)
    if opt._engine is None:
        _create_engine(opt, groups, optimizers)
        return
    assert opt._layout is not None and opt._iterate is not None
    if not same_parameters(opt._layout, groups):
        if opt._shards is not None:
            raise ValueError(
                f"step: the set of trainable parameters changed since the first step "
                f"(add_param_group, requires_grad), which {_SHARD_STATE}=True does not support "
                "yet: its ranks' slices of the state would have to move; keep the set fixed, "
                "or construct a new optimizer"
            )
        _rebuild_engine(opt, groups, optimizers)
    assert opt._layout is not None
    ranges = engine_ranges(opt._layout, optimizers, opt._offsets)
    if ranges != opt._ranges:
        _follow_schedule(opt, ranges)
