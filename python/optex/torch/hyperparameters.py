"""torch.optim's hyperparameters and OptEx's options, as the engine's values.

``optex.torch.OptEx`` takes torch.optim's names in its param groups and the
fields of ``optex.Options`` as keywords. The functions here turn them into the
engine's optimizer and ``optex.Options``, and their ValueErrors name the
setting as the user spelled it (``betas[0]``, not the engine's ``beta1``).

Nothing here knows any particular optimizer: everything is derived from the
classes the compiled module registers (``optex.optimizer_classes()``), so an
optimizer added to the C++ library is available here without a change.

- ``optimizer=`` names are the class names in lower case ("adamw" for
  ``optex.AdamW``).
- The param-group keys are the class's ``hyperparameters``, each under its own
  name, except that ``beta1`` and ``beta2`` form torch.optim's ``betas`` pair
  (in beta1's place).
- Each key's default is the class's own default (``cls()``), except ``lr``,
  whose default is the facade's ``lr`` argument (1e-3).
"""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Sequence
from typing import Any

import torch

from .._optex import Options, optimizer_classes

# An engine optimizer value: an instance of one of optex.optimizer_classes().
EngineOptimizer = Any

# The engine's two fields that torch.optim spells as one pair.
PAIR = ("beta1", "beta2")
PAIR_KEY = "betas"

# The fields of optex.Options that OptEx accepts as keyword arguments.
OPTION_FIELDS = (
    "parallelism",
    "history",
    "kernel",
    "lengthscale",
    "noise",
    "input_scaling",
    "warmup",
    "lengthscale_selection",
    "selection_interval",
    "lengthscale_grid",
    "proxy",
    "proxy_distances",
    "seed",
    "evaluations_per_point",
    "strategy",
    "continue_from",
    "max_posterior_variance",
    "trust_region",
    "max_lengthscale_change",
    "mode",
    "tolerance",
    "device",
    "threads",
    "history_precision",
)


# The optimizers, by their optimizer= name: the class name in lower case, in
# the order of optex.optimizer_classes().
CLASSES: dict[str, type] = {cls.__name__.lower(): cls for cls in optimizer_classes()}
OPTIMIZERS = tuple(CLASSES)


def _uses_pair(cls: type) -> bool:
    return all(name in cls.hyperparameters for name in PAIR)


def group_keys(cls: type) -> tuple[str, ...]:
    """torch.optim's param-group keys of an engine optimizer class: its
    hyperparameters by their own names, with beta1 and beta2 as one ``betas``."""
    keys: list[str] = []
    for name in cls.hyperparameters:
        if _uses_pair(cls) and name in PAIR:
            if name == PAIR[0]:
                keys.append(PAIR_KEY)
        else:
            keys.append(name)
    return tuple(keys)


def class_defaults(cls: type) -> dict[str, Any]:
    """The class's own defaults (``cls()``) under torch.optim's keys."""
    value = cls()
    out: dict[str, Any] = {}
    for key in group_keys(cls):
        if key == PAIR_KEY and _uses_pair(cls):
            out[key] = tuple(getattr(value, name) for name in PAIR)
        else:
            out[key] = getattr(value, key)
    return out


# The hyperparameters each optimizer reads from a param group, in torch.optim's names.
GROUP_KEYS: dict[str, tuple[str, ...]] = {kind: group_keys(cls) for kind, cls in CLASSES.items()}


@functools.cache
def _is_flag(cls: type, name: str) -> bool:
    """Whether a hyperparameter is a bool (its default is), not a real number."""
    return isinstance(getattr(cls(), name), bool)


def defaults(optimizer: Any, lr: Any, given: dict[str, Any]) -> dict[str, Any]:
    """The defaults of the param groups: ``lr``, the hyperparameters ``given``
    (torch.optim's names; None means not given), and the class's own defaults
    for the others. ValueError for an unknown optimizer or a hyperparameter it
    does not take (``momentum`` with Adam, ``betas`` with SGD, a misspelled name)."""
    if not isinstance(optimizer, str) or optimizer not in CLASSES:
        raise ValueError(
            f"optimizer: must be one of {', '.join(repr(o) for o in OPTIMIZERS)}, "
            f"got {optimizer!r}"
        )
    keys = GROUP_KEYS[optimizer]
    for name, value in given.items():
        if name not in keys:
            known = any(name in other for other in GROUP_KEYS.values())
            raise ValueError(
                f"{name}: not a hyperparameter of optimizer={optimizer!r} "
                f"(it takes {', '.join(keys)})"
                + ("" if known else ", nor a keyword argument of optex.torch.OptEx")
                + f", got {value!r}"
            )
    result = class_defaults(CLASSES[optimizer])
    result["lr"] = lr
    for name, value in given.items():
        if value is not None:
            result[name] = value
    return result


def real(name: str, value: Any) -> float:
    """A hyperparameter as a float (Python numbers and one-element tensors)."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_nested or value.device.type == "meta":
            raise ValueError(f"{name}: must be a number, got a {value.layout} tensor on "
                             f"{value.device.type} (a dense tensor with a value is needed)")
        if value.numel() != 1:
            raise ValueError(f"{name}: must be a number, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: must be a real number, got {value!r}")
    return float(value)


def _engine_values(cls: type, group: dict[str, Any]) -> dict[str, Any]:
    """The group's hyperparameters as the class's keyword arguments, checked for
    their type (ValueError naming torch.optim's key)."""
    values: dict[str, Any] = {}
    for key in group_keys(cls):
        value = group[key]
        if key == PAIR_KEY and _uses_pair(cls):
            if not (isinstance(value, (tuple, list)) and len(value) == 2):
                raise ValueError(f"{key}: must be a pair ({', '.join(PAIR)}), got {value!r}")
            for i, name in enumerate(PAIR):
                values[name] = real(f"{key}[{i}]", value[i])
        elif _is_flag(cls, key):
            if not isinstance(value, bool):
                raise ValueError(f"{key}: must be a bool, got {value!r}")
            values[key] = value
        else:
            values[key] = real(key, value)
    return values


# The keys a param group may hold besides its hyperparameters: torch.optim.Optimizer's
# own ("params", and "param_names" for parameters given by name), and the bookkeeping of
# torch.optim's LR schedulers, which they write into the groups of any optimizer
# (LRScheduler's "initial_lr", OneCycleLR's "max_lr" and "min_lr", OneCycleLR's and
# CyclicLR's "base_momentum" and "max_momentum", SWALR's "swa_lr").
TORCH_KEYS = ("params", "param_names")
SCHEDULER_KEYS = ("initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum", "swa_lr")


@functools.cache
def foreign_keys(kind: str) -> frozenset[str]:
    """The options of every torch.optim optimizer and of every other OptEx kind that
    optimizer=``kind`` does not have: in a param group they would be kept and silently
    ignored (Adam's ``amsgrad``, SGD's ``dampening``, ...). Read from torch.optim's own
    constructors, so a newer torch's options are known too."""
    keys: set[str] = set()
    for name in dir(torch.optim):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)) or cls is torch.optim.Optimizer:
            continue
        try:
            parameters = inspect.signature(cls.__init__).parameters.values()
        except (TypeError, ValueError):
            continue
        keys.update(p.name for p in parameters
                    if p.name not in ("self", "params") and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD))
    for other in GROUP_KEYS.values():
        keys.update(other)
    return frozenset(keys - set(GROUP_KEYS[kind]) - set(TORCH_KEYS) - set(SCHEDULER_KEYS))


def check_group_keys(kind: str, group: dict[str, Any], where: str) -> None:
    """ValueError, prefixed by `where`, unless ``group`` holds every hyperparameter of
    optimizer=``kind`` and no option of another optimizer (foreign_keys): such a key
    would be kept and silently ignored. Keys that are no optimizer's option (a user's
    label such as "name" or "lr_scale") are the user's, and stay, as torch.optim keeps
    them."""
    keys = GROUP_KEYS[kind]
    if not isinstance(group, dict):
        raise ValueError(f"{where}must be a dict, got {type(group).__name__}")
    missing = [k for k in keys if k not in group]
    if missing:
        raise ValueError(
            f"{where}has no {', '.join(missing)} (a param group of optimizer={kind!r} holds "
            f"{', '.join(keys)})"
        )
    foreign = foreign_keys(kind)
    unknown = [k for k in group if not isinstance(k, str) or k in foreign]
    if unknown:
        owners = {k: [kind for kind, other in GROUP_KEYS.items() if k in other]
                  for k in unknown if isinstance(k, str)}
        elsewhere = "".join(f"; {k!r} is a hyperparameter of optimizer={', '.join(map(repr, kinds))}"
                            for k, kinds in owners.items() if kinds)
        raise ValueError(
            f"{where}{', '.join(repr(k) for k in unknown)}: not "
            f"{'a key' if len(unknown) == 1 else 'keys'} of an optex.torch.OptEx param group with "
            f"optimizer={kind!r}, which holds {', '.join(keys)} and 'params' (and the LR schedulers' "
            f"{', '.join(SCHEDULER_KEYS)}){elsewhere}; torch.optim's options such as amsgrad, "
            "maximize, foreach or fused are not offered"
        )


def make_optimizer(kind: str, group: dict[str, Any], where: str) -> EngineOptimizer:
    """The engine's optimizer for a group's (or the defaults') hyperparameters;
    ValueError prefixed by `where` and naming the setting (or the key that is missing
    or unknown: check_group_keys)."""
    cls = CLASSES[kind]
    check_group_keys(kind, group, where)
    try:
        values = _engine_values(cls, group)
        try:
            return cls(**values)
        except ValueError as error:  # name torch's 'betas' for the engine's beta1/beta2
            text = str(error)
            if _uses_pair(cls):
                for i, name in enumerate(PAIR):
                    if text.startswith(name + ":"):
                        text = f"{PAIR_KEY}[{i}]" + text[len(name):]
            raise ValueError(text) from None
    except ValueError as error:
        raise ValueError(f"{where}{error}") from None


def group_optimizers(kind: str, groups: Sequence[dict[str, Any]]) -> list[EngineOptimizer]:
    """The engine optimizer of each param group, from its own hyperparameters
    (ValueError naming the group and the setting)."""
    return [make_optimizer(kind, group, where=f"param_groups[{g}]: ") for g, group in enumerate(groups)]


def kind_of(optimizer: EngineOptimizer) -> str:
    """The ``optimizer=`` name of an engine optimizer value."""
    return type(optimizer).__name__.lower()


def make_options(options: Options | None, fields: dict[str, Any]) -> Options:
    """``options`` (or the defaults) with the keyword arguments that are not None
    set; ValueError naming the field. The fields are validated together, so that
    fields that depend on each other (parallelism and evaluations_per_point) can
    change at once."""
    if options is not None and not isinstance(options, Options):
        raise ValueError(f"options: must be an optex.Options or None, got {type(options).__name__}")
    values = {} if options is None else {name: getattr(options, name) for name in OPTION_FIELDS}
    values.update({name: value for name, value in fields.items() if value is not None})
    try:
        return Options(**values)
    except (TypeError, ValueError) as error:  # Options names the field
        raise ValueError(str(error)) from None


def copy_options(options: Options) -> Options:
    return Options(**{name: getattr(options, name) for name in OPTION_FIELDS})


def options_on(options: Options, device: str) -> Options:
    """A copy of ``options`` that runs the engine on ``device``."""
    options = copy_options(options)
    try:
        options.device = device
    except (TypeError, ValueError) as error:
        text = str(error)
        raise ValueError(text if text.startswith("device") else f"device: {text}") from None
    return options


def options_key(options: Options) -> str:
    """Options without the device and the threads (ranks may run their engines on different
    GPUs, and on machines with different cores: neither changes the results)."""
    return ",".join(f"{name}={getattr(options, name)!r}" for name in OPTION_FIELDS
                    if name not in ("device", "threads"))
