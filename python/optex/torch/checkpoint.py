"""``optex.torch.OptEx.state_dict``: torch.optim's shape, made of tensors only.

    {"state": {i: {<slot>: tensor shaped like parameter i, ..., "step": int64 0-dim tensor}},
     "param_groups": [... torch.optim's, "params" as indices ...],
     "optex": {"format": 1,
               "optimizer": the optimizer= name ("adam", "sgd", ...),
               "trainable": int64 tensor, the indices of the engine's parameters in order,
               "engine": the engine's state (optex.OptEx.state_arrays) without its
                         iterate's per-parameter parts: iterate "x", counters, options,
                         random state, lengthscale, round state, and "history" unless
                         it was left out}}

The per-parameter entries are torch.optim's: the slots under torch.optim's
names (Adam's ``exp_avg`` and ``exp_avg_sq``, SGD's ``momentum_buffer``...) and
the parameter's own ``step`` count, for every parameter that has a state (in
the engine, or set aside while frozen). Everything is a tensor, a Python scalar,
a string, a list or a dict, so ``torch.load(weights_only=True)`` reads it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from . import state_dict_checks as _checks
from .layout import FlatLayout
from .trainable import Shelf, StepOffsets

FORMAT = 1
KEY = "optex"
# The engine state's keys that the per-parameter entries hold instead.
_PER_PARAMETER = ("slots", "step", "optimizer")


def _to_torch(value: Any) -> Any:
    """numpy arrays as tensors (copies), numpy scalars as Python scalars, recursively."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(value.copy())
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, dict):
        return {k: _to_torch(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_torch(v) for v in value]
    return value


def save(engine: Any, kind: str, layout: FlatLayout, params: Sequence[torch.Tensor],
         offsets: StepOffsets, shelf: Shelf, history: bool) -> tuple[dict[int, dict[str, torch.Tensor]], dict[str, Any]]:
    """(torch.optim's per-parameter "state", the "optex" entry) of a running engine
    of optimizer=``kind``; ``params`` are all parameters in param-group order
    (their state_dict indices)."""
    arrays = engine.state_arrays(history=history)
    step = int(arrays["step"])
    index = {id(p): i for i, p in enumerate(params)}
    state: dict[int, dict[str, torch.Tensor]] = {}
    for p, segment in zip(layout.params, layout.segments()):
        entry = {name: torch.from_numpy(values[segment.offset:segment.stop].copy()).view(p.shape)
                 for name, values in arrays["slots"].items()}
        entry["step"] = torch.tensor(step - offsets.of(p), dtype=torch.int64)
        state[index[id(p)]] = entry
    for p in params:
        shelved = shelf.get(p)
        if shelved is not None and index[id(p)] not in state:
            slots, own_step = shelved
            entry = {name: values.clone().view(p.shape) for name, values in slots.items()}
            entry["step"] = torch.tensor(own_step, dtype=torch.int64)
            state[index[id(p)]] = entry
    engine_part = {k: _to_torch(v) for k, v in arrays.items() if k not in _PER_PARAMETER}
    engine_part["step"] = step
    trainable = torch.tensor([index[id(p)] for p in layout.params], dtype=torch.int64)
    return state, {"format": FORMAT, "optimizer": kind, "trainable": trainable, "engine": engine_part}


def is_optex_state(state_dict: Any) -> bool:
    return isinstance(state_dict, dict) and KEY in state_dict


def trainable_indices(optex_part: Any, count: int, kind: str) -> list[int]:
    """The engine's parameters (indices into the param-group order), checked:
    a strictly increasing sequence of valid indices; ValueError also for a state
    saved with another optimizer= than ``kind``."""
    if not isinstance(optex_part, dict):
        raise ValueError(f"state_dict['{KEY}']: must be a dict, got {type(optex_part).__name__}")
    fmt = optex_part.get("format")
    if type(fmt) is not int or fmt != FORMAT:
        raise ValueError(f"state_dict['{KEY}']['format']: expected {FORMAT}, got {_checks.describe(fmt)}")
    expected = ("format", "optimizer", "trainable", "engine")
    extra = [k for k in optex_part if k not in expected]
    if extra:
        raise ValueError(f"state_dict['{KEY}']: unknown keys {sorted(map(str, extra))}")
    missing = [k for k in expected if k not in optex_part]
    if missing:
        raise ValueError(f"state_dict['{KEY}']: has no {', '.join(map(repr, missing))}")
    saved_kind = optex_part["optimizer"]
    if not isinstance(saved_kind, str) or saved_kind != kind:
        raise ValueError(
            f"state_dict: saved with optimizer={saved_kind!r}, this optimizer has optimizer={kind!r}"
            if isinstance(saved_kind, str) else
            f"state_dict['{KEY}']['optimizer']: must be a str, got {_checks.describe(saved_kind)}"
        )
    trainable = _checks.tensor(optex_part["trainable"], f"state_dict['{KEY}']['trainable']", torch.int64)
    if trainable.dim() != 1:
        raise ValueError(f"state_dict['{KEY}']['trainable']: must be a 1-dim int64 tensor, got "
                         f"{_checks.describe(trainable)}")
    indices = trainable.tolist()
    if not indices or any(i < 0 or i >= count for i in indices) or any(
            b <= a for a, b in zip(indices, indices[1:])):
        raise ValueError(
            f"state_dict['{KEY}']['trainable']: must be increasing parameter indices in "
            f"[0, {count}), got {indices[:8]}{'...' if len(indices) > 8 else ''}"
        )
    if not isinstance(optex_part["engine"], dict):
        raise ValueError(f"state_dict['{KEY}']['engine']: must be a dict, got "
                         f"{_checks.describe(optex_part['engine'])}")
    written_elsewhere = [k for k in _PER_PARAMETER if k != "step" and k in optex_part["engine"]]
    if written_elsewhere:
        raise ValueError(f"state_dict['{KEY}']['engine']: unknown keys {written_elsewhere} (the "
                         "per-parameter entries of 'state' hold the slots, and the param groups the "
                         "hyperparameters)")
    return indices


def _slot_values(entry: dict[Any, Any], i: int, slot_names: Sequence[str], shape: torch.Size,
                 finite: bool) -> dict[str, torch.Tensor]:
    """Parameter i's slots as flat float32 CPU tensors (views); ValueError naming the
    slot unless each is a dense float32 tensor shaped like the parameter (and finite, if
    asked: the engine checks the values of the slots it takes itself)."""
    out = {}
    for name in slot_names:
        where = f"state_dict['state'][{i}]['{name}']"
        if name not in entry:
            raise ValueError(f"{where}: missing (every parameter's state holds "
                             f"{', '.join(slot_names)}, step)")
        value = _checks.tensor(entry[name], where, torch.float32, shape, finite=finite)
        out[name] = value.cpu().reshape(-1)
    return out


def _check_entry_keys(entry: dict[Any, Any], i: int, slot_names: Sequence[str]) -> None:
    unknown = set(entry) - set(slot_names) - {"step"}
    if unknown:
        raise ValueError(f"state_dict['state'][{i}]: unknown keys {sorted(map(str, unknown))} "
                         f"(expected {', '.join([*slot_names, 'step'])})")


def engine_arrays(optex_part: dict[str, Any], state: Any, layout: FlatLayout,
                  params: Sequence[torch.Tensor]) -> tuple[dict[str, Any], dict[int, int]]:
    """The engine state to build from (without "optimizer", the caller's), and each
    engine parameter's own step count by identity; ValueError naming the entry for
    a missing or malformed one. The slot names are those of the first engine
    parameter's entry; every other one must have the same (the engine then checks
    that they are its optimizer's)."""
    step = _checks.integer(optex_part["engine"].get("step"), f"state_dict['{KEY}']['engine']['step']")
    arrays = _checks.to_numpy(dict(optex_part["engine"]), f"state_dict['{KEY}']['engine']")
    if step < 0:
        raise ValueError(f"state_dict['{KEY}']['engine']['step']: must be >= 0, got {step}")
    if not isinstance(state, dict):
        raise ValueError(f"state_dict['state']: must be a dict, got {type(state).__name__}")
    _checks.check_state_keys(state, len(params))
    index = {id(p): i for i, p in enumerate(params)}
    first = state.get(index[id(layout.params[0])])
    slot_names = sorted(k for k in first if k != "step") if isinstance(first, dict) else []
    slots = {name: np.empty(layout.dim, dtype=np.float32) for name in slot_names}
    own_steps: dict[int, int] = {}
    for p, segment in zip(layout.params, layout.segments()):
        i = index[id(p)]
        entry = state.get(i)
        if not isinstance(entry, dict):
            raise ValueError(f"state_dict['state'][{i}]: missing (the engine's parameter {i} has no state)")
        _check_entry_keys(entry, i, slot_names)
        for name, values in _slot_values(entry, i, slot_names, p.shape, finite=False).items():
            slots[name][segment.offset:segment.stop] = values.numpy()
        own = _own_step(entry, i, step)
        own_steps[id(p)] = own
    arrays["slots"] = slots
    arrays["step"] = step
    return arrays, own_steps


def _own_step(entry: dict[Any, Any], i: int, step: int) -> int:
    where = f"state_dict['state'][{i}]['step']"
    if "step" not in entry:
        raise ValueError(f"{where}: missing")
    own = _checks.integer(entry["step"], where)
    if not 0 <= own <= step:
        raise ValueError(f"{where}: must be in [0, {step}] (the engine's step count), got {own}")
    return own


def shelved_states(state: dict[Any, Any], trainable: set[int], params: Sequence[torch.Tensor],
                   slot_names: Sequence[str], step: int) -> list[tuple[torch.Tensor, dict[str, torch.Tensor], int]]:
    """The per-parameter states of parameters outside the engine (frozen when saved):
    the engine's slots, finite, shaped like the parameter, and an own step count in
    [0, ``step``] (a parameter left the engine at a step count it had reached)."""
    out = []
    for i, p in enumerate(params):
        entry = state.get(i)
        if i in trainable or entry is None:
            continue
        if not isinstance(entry, dict):
            raise ValueError(f"state_dict['state'][{i}]: must be a dict")
        _check_entry_keys(entry, i, slot_names)
        slots = {name: values.clone() for name, values in
                 _slot_values(entry, i, slot_names, p.shape, finite=True).items()}
        out.append((p, slots, _own_step(entry, i, step)))
    return out
