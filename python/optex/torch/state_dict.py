"""``optex.torch.OptEx.state_dict`` and ``load_state_dict``: what saving and loading do.

checkpoint.py holds the format (the engine's arrays <-> torch.optim's per-parameter
tensors) and state_dict_checks.py what a state must be to load; this module puts
them to work on the optimizer: ``state_dict`` adds the engine's part to
torch.optim's, and ``load_state_dict`` checks a state whole, builds its engine,
and only then replaces the optimizer's param groups, state and engine (a refused
state changes nothing). The earlier format, one engine checkpoint file's bytes
under ``state[0]["optex_checkpoint"]``, still loads.
"""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any

import torch

from .._optex import OptEx as _Engine
from . import checkpoint as _checkpoint
from . import hyperparameters as _hyper
from . import state_dict_checks as _checks
from .layout import FlatLayout
from .sharded import OPTION as _SHARD_STATE
from .trainable import Shelf, StepOffsets, engine_ranges, range_entries

if TYPE_CHECKING:
    from .optimizer import OptEx

# The key of the engine checkpoint in state_dict()["state"][0].
_CHECKPOINT_KEY = "optex_checkpoint"


def check_save(opt: OptEx, history: Any) -> None:
    """``state_dict``'s arguments and param groups, checked before torch.optim's part."""
    if not isinstance(history, bool):
        raise ValueError(f"history: must be a bool, got {history!r}")
    try:  # param groups changed by hand: refused here rather than written unloadable
        _hyper.group_optimizers(opt._kind, opt.param_groups)
    except ValueError as error:
        raise ValueError(f"state_dict: {error} (load_state_dict would refuse it)") from None


def with_engine_state(opt: OptEx, result: dict[str, Any], history: bool) -> dict[str, Any]:
    """torch.optim's ``state_dict()`` ``result`` with the engine's part: the
    per-parameter state and the ``"optex"`` entry (none before the first step)."""
    if opt._engine is None:
        return result
    if opt._shards is not None:
        raise RuntimeError(
            f"state_dict: {_SHARD_STATE}=True: each rank holds only its slice of the "
            "optimizer state and the history, and a state_dict of sharded state is not "
            "available yet (it is refused rather than written incomplete); checkpoint the "
            "model's parameters, or train with shard_state=False where a checkpoint is needed"
        )
    if opt._engine.pending:
        raise RuntimeError(
            "state_dict: the last step failed mid-round and its round is still pending; "
            "call step(closure) again to finish it before saving"
        )
    assert opt._layout is not None
    state, optex_part = _checkpoint.save(opt._engine, opt._kind, opt._layout, opt._params(),
                                         opt._offsets, opt._shelf, history)
    result["state"] = state
    result[_checkpoint.KEY] = optex_part
    return result


def load(opt: OptEx, state_dict: dict[str, Any]) -> None:
    """The body of ``OptEx.load_state_dict``: checked, then loaded, or nothing changed."""
    _checks.check_top(state_dict, _checkpoint.KEY)
    groups, state = state_dict[_checks.GROUPS], state_dict[_checks.STATE]
    first = state.get(0)
    blob = isinstance(first, dict) and _CHECKPOINT_KEY in first
    if state and not blob and not _checkpoint.is_optex_state(state_dict):
        raise ValueError(
            "state_dict: not an optex.torch.OptEx state (it has a 'state' but no "
            f"'{_checkpoint.KEY}' entry: a torch.optim optimizer's?)"
        )
    _checks.check_param_groups(opt._kind, groups, opt.param_groups)
    if opt._shard_state and (state or _checkpoint.is_optex_state(state_dict)):
        raise ValueError(
            f"state_dict: {_SHARD_STATE}=True cannot load an optimizer state yet (its ranks "
            "would each need their slice of it); only a state saved before the first step "
            "(without one) loads"
        )
    if blob:
        _load_engine_blob(opt, state_dict)
        return
    # torch.optim's own checks and param groups first; put back unless
    # everything loads, so that a refused state changes nothing.
    old_groups, old_state, old_defaults = opt.param_groups, opt.state, dict(opt.defaults)
    opt._torch_load_groups(groups)
    new_groups = opt.param_groups
    try:
        engine, layout, offsets, shelf, ranges = _engine_from_state(opt, state_dict, new_groups)
    except BaseException:
        opt.param_groups, opt.state = old_groups, old_state
        opt.defaults.clear()
        opt.defaults.update(old_defaults)
        raise
    opt.state.clear()
    opt._engine, opt._layout, opt._last_info = engine, layout, None
    opt._iteration = 0 if engine is None else int(engine.iteration)
    opt._offsets, opt._shelf = offsets, shelf
    if engine is None or layout is None:
        opt._iterate, opt._ranges = None, []
        return
    opt._ranges = ranges
    opt._options = engine.options
    opt._iterate = torch.from_numpy(engine.x).to(layout.device)


def _engine_from_state(opt: OptEx, state_dict: dict[str, Any], groups: list[dict[str, Any]]) -> tuple:
    """(engine, layout, offsets, shelf, ranges) of a state_dict() (Nones and empties
    for a state saved before the first step); ValueError for a malformed one."""
    offsets, shelf = StepOffsets(), Shelf()
    if not _checkpoint.is_optex_state(state_dict):
        return None, None, offsets, shelf, []
    state = state_dict["state"]
    params = [p for group in groups for p in group["params"]]
    optex_part = state_dict[_checkpoint.KEY]
    indices = _checkpoint.trainable_indices(optex_part, len(params), opt._kind)
    chosen = set(indices)
    layout = FlatLayout([[p for p, i in zip(group["params"], indices_of) if i in chosen]
                         for group, indices_of in _indexed(groups)])
    arrays, own_steps = _checkpoint.engine_arrays(optex_part, state, layout, params)
    for p in layout.params:
        offsets.set(p, int(arrays["step"]) - own_steps[id(p)])
    ranges = engine_ranges(layout, _hyper.group_optimizers(opt._kind, groups), offsets)
    arrays["optimizer"] = range_entries(ranges)
    try:
        engine = _Engine.from_state_arrays(arrays, device=opt._engine_device())
    except (ValueError, TypeError, OverflowError) as error:
        raise ValueError(f"state_dict: {error}") from None
    step = int(arrays["step"])
    for p, slots, own in _checkpoint.shelved_states(state, chosen, params, list(arrays["slots"]), step):
        _checks.check_shelved(arrays, groups, p, slots, step - own, opt._kind)
        shelf.put(p, slots, own)
    return engine, layout, offsets, shelf, ranges


def _load_engine_blob(opt: OptEx, state_dict: dict[str, Any]) -> None:
    """The earlier state_dict format: one engine checkpoint (bytes) for all parameters."""
    entry = state_dict["state"].get(0)
    if len(state_dict["state"]) != 1 or not isinstance(entry.get(_CHECKPOINT_KEY), (bytes, bytearray)):
        raise ValueError(
            "state_dict: not an optex.torch.OptEx state (expected 'state' to be empty "
            f"or {{0: {{'{_CHECKPOINT_KEY}': bytes, ...}}}}, got keys {list(state_dict['state'])})"
        )
    engine = _engine_from_bytes(bytes(entry[_CHECKPOINT_KEY]), opt._engine_device())
    kind = _hyper.kind_of(engine.optimizer)
    if kind != opt._kind:
        raise ValueError(
            f"state_dict: saved with optimizer={kind!r}, this optimizer has optimizer={opt._kind!r}"
        )
    layout = FlatLayout([group["params"] for group in opt.param_groups])
    if engine.dim != layout.dim:
        raise ValueError(
            f"state_dict: the checkpoint is for {engine.dim} parameters, this optimizer has {layout.dim}"
        )
    opt._torch_load_groups(state_dict["param_groups"])
    opt.state.clear()
    opt._engine, opt._layout, opt._last_info = engine, layout, None
    opt._offsets, opt._shelf = StepOffsets(), Shelf()
    opt._iteration = int(engine.iteration)
    opt._ranges = engine_ranges(layout, _hyper.group_optimizers(opt._kind, opt.param_groups),
                                opt._offsets)
    opt._options = engine.options
    opt._iterate = torch.from_numpy(engine.x).to(layout.device)


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
