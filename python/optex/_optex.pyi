# Type stub of the compiled module optex._optex (python/src/*.cpp); everything
# here is re-exported by optex/__init__.py.
import os
from collections.abc import Callable, Sequence
from typing import ClassVar, Literal, final

import numpy as np
from numpy.typing import ArrayLike, NDArray

from optex import problems as problems

# What `from optex._optex import *` gives (module.cpp): every public name but problems.
__all__ = [
    "Adam",
    "AdamW",
    "DeviceArray",
    "IterationInfo",
    "Lion",
    "OptEx",
    "OptimizerState",
    "Options",
    "RmsProp",
    "Sgd",
    "apply_step",
    "built_with_cuda",
    "cuda_device_count",
    "init_state",
    "magnitude_bound",
    "optimizer_classes",
    "point_range",
]

__version__: str

_KernelName = Literal["matern12", "matern32", "matern52", "rbf"]
_ProxyName = Literal["gp", "target", "last_gradient"]
_InputScalingName = Literal["none", "reference_mean_sqrt_norm"]
_WarmupName = Literal["zero_gradient", "last_gradient"]
_LengthscaleSelectionName = Literal["fixed", "leave_one_out", "marginal_likelihood"]
_PrecisionName = Literal["fp32", "bf16", "bf16_gradients"]
_StrategyName = Literal["fixed", "adaptive"]
_ContinueFromName = Literal["last", "best_loss"]
_ChainStop = Literal["", "posterior_variance", "trust_region"]
# "cpu", "cuda" or "cuda:<index>"
_DeviceName = str
_Path = str | bytes | os.PathLike[str] | os.PathLike[bytes]

def built_with_cuda() -> bool: ...
def cuda_device_count() -> int: ...
def magnitude_bound(d: int) -> float: ...
def point_range(points: int, groups: int, group: int) -> range: ...
# The base optimizer classes (optimizers.cpp registers one per entry of each
# optimizer's python_classes()). Value types: attributes are validated on
# assignment, == compares class and values, pickle and copy work, no hash.
@final
class Sgd:
    hyperparameters: ClassVar[tuple[str, ...]]
    kind: ClassVar[Literal["sgd"]]
    lr: float
    momentum: float
    nesterov: bool
    weight_decay: float
    def __init__(
        self, lr: float = 0.01, momentum: float = 0.0, nesterov: bool = False, weight_decay: float = 0.0
    ) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class Adam:
    hyperparameters: ClassVar[tuple[str, ...]]
    kind: ClassVar[Literal["adam"]]
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    def __init__(
        self,
        lr: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-08,
        weight_decay: float = 0.0,
    ) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class AdamW:
    hyperparameters: ClassVar[tuple[str, ...]]
    kind: ClassVar[Literal["adam"]]
    lr: float
    beta1: float
    beta2: float
    eps: float
    weight_decay: float
    def __init__(
        self,
        lr: float = 0.001,
        beta1: float = 0.9,
        beta2: float = 0.999,
        eps: float = 1e-08,
        weight_decay: float = 0.01,
    ) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class RmsProp:
    hyperparameters: ClassVar[tuple[str, ...]]
    kind: ClassVar[Literal["rmsprop"]]
    lr: float
    alpha: float
    eps: float
    weight_decay: float
    momentum: float
    centered: bool
    def __init__(
        self,
        lr: float = 0.01,
        alpha: float = 0.99,
        eps: float = 1e-08,
        weight_decay: float = 0.0,
        momentum: float = 0.0,
        centered: bool = False,
    ) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class Lion:
    hyperparameters: ClassVar[tuple[str, ...]]
    kind: ClassVar[Literal["lion"]]
    lr: float
    beta1: float
    beta2: float
    weight_decay: float
    def __init__(
        self, lr: float = 0.0001, beta1: float = 0.9, beta2: float = 0.99, weight_decay: float = 0.0
    ) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

_Optimizer = Sgd | Adam | AdamW | RmsProp | Lion
# Hyperparameters per contiguous range of x: a list or tuple of (size, optimizer)
# pairs, in order, sizes adding up to d, every optimizer of one kind.
_OptimizerRanges = Sequence[tuple[int, _Optimizer]]

def optimizer_classes() -> tuple[type[_Optimizer], ...]: ...
@final
class OptimizerState:
    @property
    def step(self) -> int: ...
    # float32 copies; None for a slot the optimizer does not keep.
    @property
    def slots(self) -> tuple[NDArray[np.float32] | None, ...]: ...
    def __copy__(self) -> OptimizerState: ...
    def __deepcopy__(self, memo: object) -> OptimizerState: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

def init_state(optimizer: _Optimizer | _OptimizerRanges, dim: int) -> OptimizerState: ...
def apply_step(
    optimizer: _Optimizer | _OptimizerRanges, x: NDArray[np.float32], state: OptimizerState, grad: ArrayLike
) -> None: ...

@final
class Options:
    parallelism: int
    history: int
    kernel: _KernelName
    lengthscale: float
    noise: float
    input_scaling: _InputScalingName
    warmup: _WarmupName
    lengthscale_selection: _LengthscaleSelectionName
    selection_interval: int
    # Set from any sequence of floats; read back as a tuple.
    lengthscale_grid: tuple[float, ...]
    proxy: _ProxyName
    seed: int
    evaluations_per_point: int
    strategy: _StrategyName
    continue_from: _ContinueFromName
    # float("inf") turns each of the three safeguards off (the default).
    max_posterior_variance: float
    trust_region: float
    max_lengthscale_change: float
    device: _DeviceName
    history_precision: _PrecisionName
    def __init__(
        self,
        *,
        parallelism: int = 4,
        history: int = 32,
        kernel: _KernelName = "matern52",
        lengthscale: float = 0.1,
        noise: float = 0.001,
        input_scaling: _InputScalingName = "none",
        warmup: _WarmupName = "last_gradient",
        lengthscale_selection: _LengthscaleSelectionName = "leave_one_out",
        selection_interval: int = 1,
        lengthscale_grid: Sequence[float] = (),
        proxy: _ProxyName = "gp",
        seed: int = 0,
        evaluations_per_point: int = 1,
        strategy: _StrategyName = "fixed",
        continue_from: _ContinueFromName = "last",
        max_posterior_variance: float = ...,  # inf
        trust_region: float = ...,  # inf
        max_lengthscale_change: float = ...,  # inf
        device: _DeviceName = "cpu",
        history_precision: _PrecisionName = "fp32",
    ) -> None: ...
    @staticmethod
    def reference(parallelism: int = 5) -> Options: ...
    @staticmethod
    def adaptive(parallelism: int = 4) -> Options: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]

@final
class IterationInfo:
    @property
    def iteration(self) -> int: ...
    @property
    def evaluations(self) -> int: ...
    @property
    def loss(self) -> float: ...
    @property
    def best_loss(self) -> float: ...
    @property
    def grad_norm(self) -> float: ...
    @property
    def cosine(self) -> float: ...
    @property
    def lengthscale(self) -> float: ...
    @property
    def committed_point(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    # Per distinct point of the round, in batch order (nan where not defined).
    @property
    def point_evaluations(self) -> list[int]: ...
    @property
    def posterior_variance(self) -> list[float]: ...
    @property
    def prediction_error(self) -> list[float]: ...
    @property
    def gradient_noise(self) -> float: ...
    @property
    def chain_stop(self) -> _ChainStop: ...

@final
class DeviceArray:
    @property
    def shape(self) -> tuple[int, int] | tuple[int]: ...
    @property
    def device(self) -> _DeviceName: ...
    @property
    def writable(self) -> bool: ...
    def __dlpack__(
        self,
        *,
        stream: int | None = None,
        max_version: tuple[int, int] | None = None,
        dl_device: tuple[int, int] | None = None,
        copy: bool | None = None,
    ) -> object: ...
    def __dlpack_device__(self) -> tuple[int, int]: ...

@final
class OptEx:
    def __init__(
        self,
        x0: ArrayLike,
        optimizer: _Optimizer | _OptimizerRanges | None = None,
        options: Options | None = None,
        *,
        parallelism: int = ...,
        history: int = ...,
        kernel: _KernelName = ...,
        lengthscale: float = ...,
        noise: float = ...,
        input_scaling: _InputScalingName = ...,
        warmup: _WarmupName = ...,
        lengthscale_selection: _LengthscaleSelectionName = ...,
        selection_interval: int = ...,
        lengthscale_grid: Sequence[float] = ...,
        proxy: _ProxyName = ...,
        seed: int = ...,
        evaluations_per_point: int = ...,
        strategy: _StrategyName = ...,
        continue_from: _ContinueFromName = ...,
        max_posterior_variance: float = ...,
        trust_region: float = ...,
        max_lengthscale_change: float = ...,
        device: _DeviceName = ...,
        history_precision: _PrecisionName = ...,
    ) -> None: ...
    def ask(self) -> NDArray[np.float32]: ...
    def tell(
        self, grads: ArrayLike, losses: ArrayLike, *, drop_nonfinite: bool = False, unchanged: ArrayLike | None = None
    ) -> IterationInfo: ...
    def device_points(self) -> DeviceArray: ...
    def device_grads(self) -> DeviceArray: ...
    def device_x(self) -> DeviceArray: ...
    def tell_device(
        self, losses: ArrayLike, *, drop_nonfinite: bool = False, unchanged: ArrayLike | None = None
    ) -> IterationInfo: ...
    def set_optimizer(self, optimizer: _Optimizer | _OptimizerRanges) -> None: ...
    def set_gradient_oracle(
        self, fn: Callable[[NDArray[np.float32]], tuple[float, ArrayLike]] | None
    ) -> None: ...
    def save(self, path: _Path) -> None: ...
    @staticmethod
    def load(path: _Path, device: _DeviceName | None = None, history_precision: _PrecisionName | None = None) -> OptEx: ...
    @property
    def x(self) -> NDArray[np.float32]: ...
    @property
    def dim(self) -> int: ...
    @property
    def parallelism(self) -> int: ...
    @property
    def iteration(self) -> int: ...
    @property
    def evaluations(self) -> int: ...
    @property
    def optimizer_step(self) -> int: ...
    @property
    def lengthscale(self) -> float: ...
    @property
    def pending(self) -> bool: ...
    @property
    def options(self) -> Options: ...
    # The optimizer of an engine with one range, else its (size, optimizer) pairs.
    @property
    def optimizer(self) -> _Optimizer | list[tuple[int, _Optimizer]]: ...
    @property
    def seeds(self) -> NDArray[np.uint64]: ...
    def predicted_gradient(self, i: int) -> NDArray[np.float32]: ...
