"""torch.optim's hyperparameters and OptEx's options, as the engine's values.

``optex.torch.OptEx`` takes torch.optim's names (``lr``, ``betas``, ``eps``,
``weight_decay``, ``momentum``, ``nesterov``) in its param groups and the
fields of ``optex.Options`` as keywords. The functions here turn them into the
engine's optimizer (``optex.Sgd``, ``optex.Adam``, ``optex.AdamW``) and
``optex.Options``, and their ValueErrors name the setting as the user spelled
it (``betas[0]``, not the engine's ``beta1``).
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any, Union

import torch

from .._optex import Adam, AdamW, Options, Sgd

EngineOptimizer = Union[Sgd, Adam, AdamW]

OPTIMIZERS = ("adam", "adamw", "sgd")
# The hyperparameters each optimizer reads from a param group, in torch.optim's names.
GROUP_KEYS = {
    "adam": ("lr", "betas", "eps", "weight_decay"),
    "adamw": ("lr", "betas", "eps", "weight_decay"),
    "sgd": ("lr", "momentum", "nesterov", "weight_decay"),
}
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
    "seed",
    "device",
    "history_precision",
)


def defaults(optimizer: Any, lr: Any, betas: Any, eps: Any, weight_decay: Any, momentum: Any,
             nesterov: Any) -> dict[str, Any]:
    """The defaults of the param groups: the arguments given, torch.optim's defaults
    for the others. ValueError for an unknown optimizer or a hyperparameter it does
    not take (momentum with Adam, betas with SGD)."""
    if not isinstance(optimizer, str) or optimizer not in OPTIMIZERS:
        raise ValueError(
            f"optimizer: must be one of {', '.join(repr(o) for o in OPTIMIZERS)}, "
            f"got {optimizer!r}"
        )
    given = {"betas": betas, "eps": eps, "momentum": momentum, "nesterov": nesterov}
    for name, value in given.items():
        if value is not None and name not in GROUP_KEYS[optimizer]:
            raise ValueError(
                f"{name}: not a hyperparameter of optimizer={optimizer!r} "
                f"(it takes {', '.join(GROUP_KEYS[optimizer])}), got {value!r}"
            )
    if optimizer == "sgd":
        return {
            "lr": lr,
            "momentum": 0.0 if momentum is None else momentum,
            "nesterov": False if nesterov is None else nesterov,
            "weight_decay": 0.0 if weight_decay is None else weight_decay,
        }
    return {
        "lr": lr,
        "betas": (0.9, 0.999) if betas is None else betas,
        "eps": 1e-8 if eps is None else eps,
        "weight_decay": (0.01 if optimizer == "adamw" else 0.0) if weight_decay is None else weight_decay,
    }


def real(name: str, value: Any) -> float:
    """A hyperparameter as a float (Python numbers and one-element tensors)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: must be a number, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: must be a real number, got {value!r}")
    return float(value)


def make_optimizer(kind: str, group: dict[str, Any], where: str) -> EngineOptimizer:
    """The engine's optimizer for a group's (or the defaults') hyperparameters;
    ValueError prefixed by `where` and naming the setting."""
    try:
        lr = real("lr", group["lr"])
        wd = real("weight_decay", group["weight_decay"])
        if kind == "sgd":
            nesterov = group["nesterov"]
            if not isinstance(nesterov, bool):
                raise ValueError(f"nesterov: must be a bool, got {nesterov!r}")
            return Sgd(lr=lr, momentum=real("momentum", group["momentum"]),
                       nesterov=nesterov, weight_decay=wd)
        betas = group["betas"]
        if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
            raise ValueError(f"betas: must be a pair (beta1, beta2), got {betas!r}")
        beta1, beta2 = real("betas[0]", betas[0]), real("betas[1]", betas[1])
        eps = real("eps", group["eps"])
        cls = AdamW if kind == "adamw" else Adam
        try:
            return cls(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd)
        except ValueError as error:  # name torch's 'betas' for the engine's beta1/beta2
            text = str(error)
            for engine_name, torch_name in (("beta1", "betas[0]"), ("beta2", "betas[1]")):
                if text.startswith(engine_name + ":"):
                    text = torch_name + text[len(engine_name):]
            raise ValueError(text) from None
    except ValueError as error:
        raise ValueError(f"{where}{error}") from None


def _settings(kind: str, group: dict[str, Any]) -> tuple:
    """The group's hyperparameters as comparable values."""
    out = []
    for key in GROUP_KEYS[kind]:
        value = group[key]
        if key == "betas":
            value = tuple(real(key, v) for v in value)
        elif key != "nesterov":
            value = real(key, value)
        out.append((key, value))
    return tuple(out)


def shared_optimizer(kind: str, groups: Sequence[dict[str, Any]]) -> EngineOptimizer:
    """The one engine optimizer of all param groups: the engine runs one base
    optimizer over the whole vector, so every group must have group 0's
    hyperparameters (ValueError naming the group and the setting otherwise)."""
    optimizer = make_optimizer(kind, groups[0], where="param_groups[0]: ")
    first = dict(_settings(kind, groups[0]))
    for g, group in enumerate(groups[1:], start=1):
        make_optimizer(kind, group, where=f"param_groups[{g}]: ")
        for key, value in _settings(kind, group):
            if value != first[key]:
                raise ValueError(
                    f"param_groups[{g}]['{key}']: {group[key]!r} differs from "
                    f"param_groups[0]['{key}'] = {groups[0][key]!r}; "
                    "optex.torch.OptEx runs one base optimizer over all parameters, so "
                    f"every param group must have the same {', '.join(GROUP_KEYS[kind])}"
                )
    return optimizer


def kind_of(optimizer: EngineOptimizer) -> str:
    """The ``optimizer=`` name of an engine optimizer value."""
    return {Adam: "adam", AdamW: "adamw", Sgd: "sgd"}[type(optimizer)]


def make_options(options: Options | None, fields: dict[str, Any]) -> Options:
    """``options`` (or the defaults) with the keyword arguments that are not None
    set; ValueError naming the field."""
    if options is not None and not isinstance(options, Options):
        raise ValueError(f"options: must be an optex.Options or None, got {type(options).__name__}")
    result = Options() if options is None else copy_options(options)
    for name, value in fields.items():
        if value is None:
            continue
        try:
            setattr(result, name, value)
        except (TypeError, ValueError) as error:
            text = str(error)
            raise ValueError(text if text.startswith(name) else f"{name}: {text}") from None
    return result


def copy_options(options: Options) -> Options:
    copy = Options()
    for name in OPTION_FIELDS:
        setattr(copy, name, getattr(options, name))
    return copy


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
    """Options without the device (ranks may run their engines on different GPUs)."""
    return ",".join(f"{name}={getattr(options, name)!r}" for name in OPTION_FIELDS if name != "device")
