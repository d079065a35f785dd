"""What ``optex.torch.OptEx.load_state_dict`` takes: a state_dict that an
``optex.torch.OptEx`` of the same optimizer kind, over parameters of the same
shapes, could have written, and nothing else.

- The top level holds "state" and "param_groups", and "optex" once the engine
  exists (checkpoint.py); no other key.
- "param_groups" is a list with as many groups as the optimizer has, each a
  dict with the optimizer's hyperparameters and "params", and no option of
  another optimizer (hyperparameters.check_group_keys; a user's own labels
  stay, as torch.optim keeps them), each hyperparameter valid
  (hyperparameters.make_optimizer), and "params" the indices torch.optim writes:
  0, 1, ..., n - 1 in param-group order, as many per group as the group has
  parameters.
- Every tensor is checked as torch.optim would have written it before any of
  its values is read: a tensor (not a number, not a list), dense (strided, not
  sparse or nested), with values (not on the "meta" device), of its dtype, of
  its shape (a slot shaped exactly like its parameter); then its values.

Every refusal is a ValueError naming the entry (``state_dict['state'][0]['exp_avg']``)
and what it got; the caller checks everything before it changes anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .._optex import OptEx as _Engine
from . import hyperparameters as _hyper
from .trainable import range_entries

STATE, GROUPS = "state", "param_groups"

# torch dtypes that numpy represents (the engine's arrays are numpy's); the engine
# then checks that each array has exactly its own dtype.
_NUMPY_DTYPES = (torch.float16, torch.float32, torch.float64, torch.int8, torch.int16,
                 torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64,
                 torch.complex128)


def describe(value: Any) -> str:
    """How a refused value is described: its type, or a tensor's dtype and shape."""
    if isinstance(value, torch.Tensor):
        return (f"a {'' if value.layout == torch.strided else str(value.layout) + ' '}tensor "
                f"{value.dtype} of shape {tuple(value.shape)} on {value.device.type}")
    return f"{type(value).__name__} {value!r}"[:120]


def dense(value: Any, where: str, what: str) -> torch.Tensor:
    """``value`` as a tensor whose values can be read: ValueError unless it is a
    torch.Tensor, strided (not sparse, nested or of another layout) and not on the
    "meta" device (which has shapes but no values). ``what`` says what was expected."""
    if not isinstance(value, torch.Tensor):
        raise ValueError(f"{where}: must be {what}, got {describe(value)}")
    if value.layout != torch.strided or value.is_nested:
        raise ValueError(f"{where}: must be {what}, dense (strided), got {describe(value)}")
    if value.device.type == "meta":
        raise ValueError(f"{where}: must be {what} with values, got {describe(value)} (a meta tensor "
                         "has no values)")
    return value


def tensor(value: Any, where: str, dtype: torch.dtype, shape: Sequence[int] | None = None,
           finite: bool = False) -> torch.Tensor:
    """``value`` checked as a dense tensor of ``dtype`` (and of exactly ``shape``,
    and finite, if asked), detached; ValueError naming ``where`` otherwise."""
    what = f"a {'finite ' if finite else ''}{dtype} tensor" + (
        "" if shape is None else f" of shape {tuple(shape)}")
    value = dense(value, where, what)
    if value.dtype != dtype or shape is not None and tuple(value.shape) != tuple(shape):
        raise ValueError(f"{where}: must be {what}, got {describe(value)}")
    value = value.detach()
    if finite and not bool(torch.isfinite(value).all()):
        raise ValueError(f"{where}: must be {what}, got non-finite values")
    return value


def integer(value: Any, where: str) -> int:
    """A count (``step``): a Python int or a 0-dim integer tensor, as OptEx writes it."""
    if isinstance(value, torch.Tensor):
        value = dense(value, where, "an integer")
        if value.dim() != 0 or value.dtype.is_floating_point or value.dtype.is_complex \
                or value.dtype == torch.bool:
            raise ValueError(f"{where}: must be an integer (a 0-dim integer tensor), got {describe(value)}")
        return int(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{where}: must be an integer, got {describe(value)}")
    return int(value)


def to_numpy(value: Any, where: str) -> Any:
    """Tensors (dense, with values, of a dtype numpy has) as numpy arrays (copies on the
    CPU), recursively through dicts and lists; other values as they are (the engine
    checks their types)."""
    if isinstance(value, torch.Tensor):
        value = dense(value, where, "a tensor")
        if value.dtype not in _NUMPY_DTYPES:
            raise ValueError(f"{where}: must be a tensor of a dtype numpy has, got {describe(value)}")
        return value.detach().cpu().resolve_conj().resolve_neg().numpy().copy()
    if isinstance(value, dict):
        return {k: to_numpy(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_numpy(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def check_top(state_dict: Any, optex_key: str) -> None:
    """The top level: a dict with "state" and "param_groups" (and perhaps ``optex_key``),
    nothing else."""
    if not isinstance(state_dict, dict) or STATE not in state_dict or GROUPS not in state_dict:
        raise ValueError(f"state_dict: expected a dict with '{STATE}' and '{GROUPS}'"
                         + (f", got keys {sorted(map(repr, state_dict))}" if isinstance(state_dict, dict)
                            else f", got {type(state_dict).__name__}"))
    unknown = [k for k in state_dict if k not in (STATE, GROUPS, optex_key)]
    if unknown:
        raise ValueError(f"state_dict: unknown keys {', '.join(map(repr, unknown))} (an optex.torch.OptEx "
                         f"state_dict holds '{STATE}', '{GROUPS}' and '{optex_key}')")
    if not isinstance(state_dict[STATE], dict):
        raise ValueError(f"state_dict['{STATE}']: must be a dict, got {describe(state_dict[STATE])}")


def check_param_groups(kind: str, saved: Any, current: Sequence[dict[str, Any]]) -> None:
    """The saved param groups against this optimizer's ``current`` ones: their number,
    each group's keys and hyperparameters (those of optimizer=``kind``), and "params"
    as the indices torch.optim writes (0 .. n-1 in order, as many per group as the
    current group has parameters)."""
    if not isinstance(saved, list):
        raise ValueError(f"state_dict['{GROUPS}']: must be a list of dicts, got {describe(saved)}")
    if len(saved) != len(current):
        raise ValueError(f"state_dict['{GROUPS}']: has {len(saved)} groups, this optimizer has "
                         f"{len(current)}")
    start = 0
    for g, (group, mine) in enumerate(zip(saved, current)):
        where = f"state_dict['{GROUPS}'][{g}]"
        if not isinstance(group, dict):
            raise ValueError(f"{where}: must be a dict, got {describe(group)}")
        if "params" not in group:
            raise ValueError(f"{where}: has no 'params'")
        _hyper.make_optimizer(kind, group, where=f"{where}: ")  # the keys, then the values
        params = group["params"]
        count = len(mine["params"])
        expected = list(range(start, start + count))
        if not (isinstance(params, list) and all(type(i) is int for i in params) and params == expected):
            raise ValueError(
                f"{where}['params']: must be the parameter indices {_short(expected)} (torch.optim "
                f"numbers the parameters 0, 1, ... in param-group order, and this optimizer's group "
                f"{g} has {count}), got {describe(params)}"
            )
        if "param_names" in group:
            names = group["param_names"]
            if not (isinstance(names, list) and len(names) == count and all(isinstance(n, str) for n in names)):
                raise ValueError(f"{where}['param_names']: must be a list of {count} str, got {describe(names)}")
        for key in _hyper.SCHEDULER_KEYS:
            if key in group:
                _hyper.real(f"{where}['{key}']", group[key])
        start += count


def _short(indices: list[int]) -> str:
    return str(indices) if len(indices) <= 8 else f"[{indices[0]}, ..., {indices[-1]}]"


def check_state_keys(state: dict[Any, Any], count: int) -> None:
    """Every key of "state" a parameter index (an int in [0, count)), every entry a dict
    whose keys are str."""
    for i, entry in state.items():
        if type(i) is not int or not 0 <= i < count:
            raise ValueError(f"state_dict['{STATE}']: key {i!r} is not a parameter index (this optimizer "
                             f"has {count} parameters, 0 .. {count - 1})")
        if not isinstance(entry, dict):
            raise ValueError(f"state_dict['{STATE}'][{i}]: must be a dict, got {describe(entry)}")
        odd = [k for k in entry if not isinstance(k, str)]
        if odd:
            raise ValueError(f"state_dict['{STATE}'][{i}]: unknown keys {odd!r}")


def check_shelved(arrays: dict[str, Any], groups: list[dict[str, Any]], p: torch.Tensor,
                  slots: dict[str, torch.Tensor], offset: int, kind: str) -> None:
    """A shelved parameter's state (kept aside while it is frozen) must be one the engine
    can take back when the parameter returns: checked by the engine's own loader (values,
    signs, a step can be taken) on an engine state of that parameter alone, at the zero
    point, with one point per round (so that the check allocates little); ValueError
    naming the parameter."""
    if p.numel() == 0:
        return
    group = next(g for g in groups if any(q is p for q in g["params"]))
    optimizer = _hyper.make_optimizer(kind, group, where="")
    own = {k: v for k, v in arrays.items() if k not in ("history", "x", "slots", "optimizer")}
    if isinstance(own.get("options"), dict):
        own["options"] = {**own["options"], "parallelism": 1, "evaluations_per_point": 1}
    if isinstance(own.get("round"), dict):
        own["round"] = {**own["round"], "evaluations_per_point": 1}
    own["x"] = np.zeros(p.numel(), dtype=np.float32)
    own["slots"] = {name: values.numpy().copy() for name, values in slots.items()}
    own["optimizer"] = range_entries([(p.numel(), optimizer, offset)])
    try:
        _Engine.from_state_arrays(own, device="cpu")
    except (ValueError, TypeError, OverflowError) as error:
        index = next(i for i, q in enumerate(q for g in groups for q in g["params"]) if q is p)
        raise ValueError(f"state_dict['state'][{index}]: the state kept aside for this parameter "
                         f"(frozen) cannot be taken back: {error}") from None
