"""The arguments of ``optex.torch.OptEx``'s constructor and ``add_param_group``, checked.

Each check raises ValueError naming the argument (``device``, ``shard_state``,
``param_groups[g]['params'][j]``...) before anything changes, so that a refused
construction or group leaves no trace; the hyperparameters and options
themselves are hyperparameters.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from .._optex import OptEx as _Engine
from . import hyperparameters as _hyper
from .exchange import Ranks, distributed_available
from .sharded import OPTION as _SHARD_STATE
from .sharded import check_options, slices
from .trainable import trainable_groups

if TYPE_CHECKING:
    from .optimizer import OptEx


def check_parameter(p: Any, where: str) -> None:
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


def check_shard_state(shard_state: Any, distributed: bool | None, device: Any) -> bool:
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


def check_device(device: Any) -> str | None:
    """``device=``, checked: its name, or None (the parameters' device)."""
    if device is not None and not isinstance(device, (str, torch.device)):
        raise ValueError(f"device: must be a str, a torch.device or None, got {device!r}")
    return None if device is None else str(device)


def check_drop_nonfinite(drop_nonfinite: Any) -> bool:
    """``drop_nonfinite=``, checked."""
    if not isinstance(drop_nonfinite, bool):
        raise ValueError(f"drop_nonfinite: must be a bool, got {drop_nonfinite!r}")
    return drop_nonfinite


def check_distributed(distributed: Any) -> bool | None:
    """``distributed=``, checked: True needs an initialised torch.distributed."""
    if distributed is not None and not isinstance(distributed, bool):
        raise ValueError(f"distributed: must be a bool or None, got {distributed!r}")
    if distributed and not distributed_available():
        raise ValueError(
            "distributed: True needs an initialised torch.distributed "
            "(torch.distributed.init_process_group)"
        )
    return distributed


def check_added_group(kind: str, param_groups: list[dict[str, Any]], g: int) -> None:
    """ValueError, naming it, for what ``add_param_group`` refuses in the group it
    just appended, ``param_groups[g]`` (the last): no parameters, the same parameter
    twice, a parameter the engine cannot hold or on another device, a bad
    hyperparameter or another optimizer's option."""
    group = param_groups[-1]
    params = group["params"]
    if not params:
        raise ValueError(f"param_groups[{g}]['params']: has no parameters (an empty group "
                         "would optimize nothing)")
    if len(params) != len({id(p) for p in params}):
        raise ValueError(f"param_groups[{g}]: contains the same parameter twice")
    for j, p in enumerate(params):
        check_parameter(p, f"param_groups[{g}]['params'][{j}]")
    others = [p for group in param_groups[:-1] for p in group["params"]]
    first = others[0] if others else (params[0] if params else None)
    for j, p in enumerate(params):
        if first is not None and p.device != first.device:
            raise ValueError(
                f"param_groups[{g}]['params'][{j}]: on {p.device}, but the first "
                f"parameter is on {first.device}; all parameters of an "
                "optex.torch.OptEx must be on one device"
            )
    _hyper.make_optimizer(kind, group, where=f"param_groups[{g}]: ")


def check_construction(opt: OptEx) -> None:
    """After torch.optim's constructor: the param groups hold parameters with elements,
    and the options, the hyperparameters and the device are valid."""
    if not opt._params():
        raise ValueError("params: the param groups contain no parameters")
    if sum(p.numel() for p in opt._params()) == 0:
        raise ValueError("params: the parameters have no elements")
    # Validates the options, the hyperparameters and the device now, with a
    # one-dimensional engine; the real one is created at the first step.
    first = _hyper.make_optimizer(opt._kind, opt.param_groups[0], where="")
    on_device = _hyper.options_on(opt._options, opt._engine_device())
    _Engine(np.zeros(1, np.float32), first, on_device)
    if opt._shard_state:
        check_options(first, on_device)
        trainable = sum(p.numel() for params in trainable_groups(opt.param_groups) for p in params)
        if trainable:  # checked again at the first step, when the set is final
            slices(trainable, Ranks(opt._group, opt._param_device()).world)
