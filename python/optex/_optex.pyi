# Type stub of the compiled module optex._optex (python/src/*.cpp); everything
# here is re-exported by optex/__init__.py.
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Literal, NotRequired, Protocol, TypedDict, final

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
    "Plan",
    "PlanCandidate",
    "RmsProp",
    "Sgd",
    "apply_step",
    "built_with_cuda",
    "cuda_device_count",
    "init_state",
    "magnitude_bound",
    "optimizer_classes",
    "plan",
    "point_range",
    "shard_of",
    "slice_ranges",
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
_ModeName = Literal["approximate", "verified"]
_ProxyDistancesName = Literal["direct", "coefficients"]
_ChainStop = Literal["", "posterior_variance", "trust_region"]
# "cpu", "cuda" or "cuda:<index>"
_DeviceName = str
_PlanChoice = Literal["sequential", "averaging", "optex"]
_Path = str | bytes | os.PathLike[str] | os.PathLike[bytes]

def built_with_cuda() -> bool: ...
def cuda_device_count() -> int: ...
def magnitude_bound(d: int) -> float: ...
def point_range(points: int, groups: int, group: int) -> range: ...

# The planner (plan.cpp): will OptEx pay off for a gradient of this cost here?
# A repeated timing summarised (plan.cpp's spread_dict); seconds but count.
class _Spread(TypedDict):
    median: float
    low_quartile: float
    high_quartile: float
    min: float
    max: float
    count: int

@final
class PlanCandidate:
    @property
    def parallelism(self) -> int: ...
    @property
    def points(self) -> int: ...
    @property
    def evaluations_per_point(self) -> int: ...
    @property
    def history(self) -> int: ...
    @property
    def overhead_seconds(self) -> float: ...
    @property
    def overhead_spread(self) -> _Spread: ...
    @property
    def round_seconds(self) -> float: ...
    @property
    def steps_per_round(self) -> float: ...
    @property
    def seconds_per_step(self) -> float: ...
    @property
    def seconds_per_step_low(self) -> float: ...
    @property
    def seconds_per_step_high(self) -> float: ...
    @property
    def break_even_gradient_seconds(self) -> float: ...
    @property
    def break_even_low(self) -> float: ...
    @property
    def break_even_high(self) -> float: ...

@final
class Plan:
    @property
    def candidates(self) -> list[PlanCandidate]: ...
    @property
    def plain_step_seconds(self) -> float: ...
    @property
    def plain_step_spread(self) -> _Spread: ...
    @property
    def plain_seconds_per_step(self) -> float: ...
    @property
    def choice(self) -> _PlanChoice: ...
    @property
    def parallelism(self) -> int: ...
    @property
    def evaluations_per_point(self) -> int: ...
    @property
    def history(self) -> int: ...
    @property
    def break_even_gradient_seconds(self) -> float: ...
    @property
    def break_even_low(self) -> float: ...
    @property
    def break_even_high(self) -> float: ...
    @property
    def expected_round_seconds(self) -> float: ...
    @property
    def uncertain(self) -> bool: ...
    @property
    def reason(self) -> str: ...
    @property
    def assumption(self) -> str: ...
    @property
    def alternatives(self) -> str: ...

def plan(
    dim: int,
    parallelism: int,
    history: int,
    *,
    gradient_seconds: float | None = None,
    objective: Callable[[NDArray[np.float32]], tuple[float, ArrayLike]] | None = None,
    device: _DeviceName = "cpu",
    threads: int = 0,
    efficiency: float = 0.5,
    gradient_noise: float | None = None,
    repetitions: int = 5,
    round_timer: Callable[[int, int, int], float] | None = None,
    step_timer: Callable[[int], float] | None = None,
) -> Plan: ...
# The base optimizer classes (optimizers.cpp registers one per entry of each
# optimizer's python_classes()). Value types: attributes are validated on
# assignment, == compares class and values, pickle and copy work, no hash.
# state_slot_names: the names of the state slots the kind may keep (torch.optim's
# state keys), aligned with OptimizerState.slots, None for an index it never
# uses; state_slots: the same for the slots these values keep (None elsewhere).
@final
class Sgd:
    hyperparameters: ClassVar[tuple[str, ...]]
    kind: ClassVar[Literal["sgd"]]
    state_slot_names: ClassVar[tuple[Literal["momentum_buffer"], None, None]]
    # The buffer exists only with momentum.
    @property
    def state_slots(self) -> tuple[Literal["momentum_buffer"] | None, None, None]: ...
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
    state_slot_names: ClassVar[tuple[Literal["exp_avg"], Literal["exp_avg_sq"], None]]
    @property
    def state_slots(self) -> tuple[Literal["exp_avg"], Literal["exp_avg_sq"], None]: ...
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
    state_slot_names: ClassVar[tuple[Literal["exp_avg"], Literal["exp_avg_sq"], None]]
    @property
    def state_slots(self) -> tuple[Literal["exp_avg"], Literal["exp_avg_sq"], None]: ...
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
    state_slot_names: ClassVar[tuple[Literal["square_avg"], Literal["momentum_buffer"], Literal["grad_avg"]]]
    # The buffer only with momentum, the gradient average only when centered.
    @property
    def state_slots(
        self,
    ) -> tuple[Literal["square_avg"], Literal["momentum_buffer"] | None, Literal["grad_avg"] | None]: ...
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
    state_slot_names: ClassVar[tuple[Literal["exp_avg"], None, None]]
    @property
    def state_slots(self) -> tuple[Literal["exp_avg"], None, None]: ...
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
# pairs, in order, sizes adding up to d, every optimizer of one kind. A
# (size, optimizer, step_offset) triple gives the range a step offset (>= 0, at
# most the state's step count): its optimizer counts its steps from there.
_OptimizerRanges = Sequence[tuple[int, _Optimizer] | tuple[int, _Optimizer, int]]

def optimizer_classes() -> tuple[type[_Optimizer], ...]: ...
@final
class OptimizerState:
    @property
    def step(self) -> int: ...
    # float32 copies; None for a slot the optimizer does not keep. Slot j is what
    # the optimizer class's state_slot_names[j] names.
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
    proxy_distances: _ProxyDistancesName
    seed: int
    evaluations_per_point: int
    strategy: _StrategyName
    continue_from: _ContinueFromName
    # float("inf") turns each of the three safeguards off (the default).
    max_posterior_variance: float
    trust_region: float
    max_lengthscale_change: float
    mode: _ModeName
    tolerance: float
    device: _DeviceName
    threads: int  # 0: every core; never changes results, not stored in checkpoints
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
        proxy_distances: _ProxyDistancesName = "direct",
        seed: int = 0,
        evaluations_per_point: int = 1,
        strategy: _StrategyName = "fixed",
        continue_from: _ContinueFromName = "last",
        max_posterior_variance: float = ...,  # inf
        trust_region: float = ...,  # inf
        max_lengthscale_change: float = ...,  # inf
        mode: _ModeName = "approximate",
        tolerance: float = 0.0,
        device: _DeviceName = "cpu",
        threads: int = 0,
        history_precision: _PrecisionName = "fp32",
    ) -> None: ...
    @staticmethod
    def reference(parallelism: int = 5) -> Options: ...
    @staticmethod
    def adaptive(parallelism: int = 4) -> Options: ...
    @staticmethod
    def verified(parallelism: int = 8, tolerance: float = 0.0) -> Options: ...
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
    @property
    def committed_steps(self) -> int: ...
    @property
    def disagreement(self) -> float: ...

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

# OptEx.state_arrays(): the engine's whole state (layout "format" 1). Scalars are
# Python ints and floats; arrays are new numpy arrays; T0 is options["history"].
class _StateHistory(TypedDict):
    size: int  # pairs in the ring, in slots 0 .. size - 1
    next: int  # the slot the next pair goes to (size until the ring is full)
    points: NDArray[np.float32]  # (size, d), in slot order
    gradients: NDArray[np.float32]  # (size, d)
    squared_distances: NDArray[np.float64]  # (T0, T0): ||x_i - x_j||^2 (empty slots unread)
    squared_norms: NDArray[np.float64]  # (T0,): ||x_i||^2
    gradient_inner_products: NDArray[np.float64]  # (T0, T0): <g_i, g_j>

class _StateRound(TypedDict):
    # The adaptive strategy's state and the trust region's unit.
    evaluations_per_point: int  # of the next round
    gradient_noise: float  # the last measured rho; nan before the first measurement
    rounds_since_measured: int
    last_step_norm: float  # ||x_t - x_{t-1}||; nan where not measured (CUDA)
    # The verified mode's window: steps the next round redoes, from this history slot
    # (optional when read: absent, the window starts afresh).
    window_carried: int
    window_first_slot: int

class _StateArrays(TypedDict):
    format: int  # 1
    # Every Options field by name, enumerations as their names: Options(**options).
    options: dict[str, Any]
    # One dict per range, in order: "size" (int), "kind" (the class name: "Adam",
    # "AdamW", ...), "step_offset" (int) and each of the class's hyperparameters.
    optimizer: list[dict[str, Any]]
    x: NDArray[np.float32]  # (d,): the iterate
    step: int  # the optimizer state's step count
    # The slots the optimizer keeps, by their state_slot_names: (d,) each.
    slots: dict[str, NDArray[np.float32]]
    lengthscale: float
    rng: int  # the generator's state, in [0, 2**64)
    iteration: int
    evaluations: int
    history: NotRequired[_StateHistory]  # left out: an empty history
    round: _StateRound

# Sharded state (shard.cpp): which slice of a d-vector is whose, and what a
# slice engine (OptEx(..., shard=(dim, offset, sums))) completes its sums with.
def shard_of(d: int, world: int, rank: int) -> tuple[int, int]: ...
def slice_ranges(
    optimizer: _Optimizer | _OptimizerRanges, dim: int, offset: int, size: int
) -> _Optimizer | list[tuple[int, _Optimizer]] | list[tuple[int, _Optimizer, int]]: ...

class _ShardSums(Protocol):
    # In place: each value becomes its sum over every slice, added in slice order.
    def sum(self, values: NDArray[np.float64], /) -> None: ...
    # In place: each flag becomes 1 where it is nonzero on every slice, else 0.
    def all(self, flags: NDArray[np.uint8], /) -> None: ...

_Shard = tuple[int, int, _ShardSums]

@final
class OptEx:
    def __init__(
        self,
        x0: ArrayLike,
        optimizer: _Optimizer | _OptimizerRanges | None = None,
        options: Options | None = None,
        *,
        shard: _Shard | None = None,
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
        proxy_distances: _ProxyDistancesName = ...,
        seed: int = ...,
        evaluations_per_point: int = ...,
        strategy: _StrategyName = ...,
        continue_from: _ContinueFromName = ...,
        max_posterior_variance: float = ...,
        trust_region: float = ...,
        max_lengthscale_change: float = ...,
        mode: _ModeName = ...,
        tolerance: float = ...,
        device: _DeviceName = ...,
        threads: int = ...,
        history_precision: _PrecisionName = ...,
    ) -> None: ...
    def ask(self) -> NDArray[np.float32]: ...
    def tell(
        self, grads: ArrayLike, losses: ArrayLike, *, drop_nonfinite: bool = False, unchanged: ArrayLike | None = None
    ) -> IterationInfo: ...
    def observe(self, points: ArrayLike, grads: ArrayLike) -> None:
        """Adds true (point, gradient) pairs no round committed (a straggler's) to the history.

        points and grads: (m, d) or (d,) float32/float64 array-likes, pushed in order as a
        commit pushes its pairs; nothing else changes (x, optimizer state, iteration,
        evaluations, seeds). ValueError for a bad dtype, shape or value (naming the argument,
        row, column and value), RuntimeError between ask() and tell() or on a shard slice;
        the engine is unchanged after any error.
        """
    def device_points(self) -> DeviceArray: ...
    def device_grads(self) -> DeviceArray: ...
    def device_x(self) -> DeviceArray: ...
    def tell_device(
        self, losses: ArrayLike, *, drop_nonfinite: bool = False, unchanged: ArrayLike | None = None
    ) -> IterationInfo: ...
    def set_optimizer(self, optimizer: _Optimizer | _OptimizerRanges) -> None: ...
    def set_threads(self, threads: int) -> None: ...
    def set_gradient_oracle(
        self, fn: Callable[[NDArray[np.float32]], tuple[float, ArrayLike]] | None
    ) -> None: ...
    def save(self, path: _Path) -> None: ...
    @staticmethod
    def load(path: _Path, device: _DeviceName | None = None, history_precision: _PrecisionName | None = None) -> OptEx: ...
    def state_arrays(self, history: bool = True) -> _StateArrays: ...
    @staticmethod
    def from_state_arrays(
        state: Mapping[str, Any],
        *,
        device: _DeviceName | None = None,
        history_precision: _PrecisionName | None = None,
        shard: _Shard | None = None,
    ) -> OptEx: ...
    # pickle: ("optex.OptEx", format 1, state_arrays(), checksum); copies continue bit for bit.
    def __getstate__(self) -> tuple[str, int, _StateArrays, int]: ...
    def __setstate__(self, state: tuple[str, int, _StateArrays, int]) -> None: ...
    def __copy__(self) -> OptEx: ...
    def __deepcopy__(self, memo: dict[int, Any]) -> OptEx: ...
    @property
    def x(self) -> NDArray[np.float32]: ...
    @property
    def dim(self) -> int: ...
    # (dim, offset, size): the coordinates of the whole vector this engine holds.
    @property
    def shard(self) -> tuple[int, int, int]: ...
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
    # The optimizer of an engine with one range at step offset 0, else its
    # (size, optimizer) pairs, or (size, optimizer, step_offset) triples when any
    # range has a step offset.
    @property
    def optimizer(self) -> _Optimizer | list[tuple[int, _Optimizer]] | list[tuple[int, _Optimizer, int]]: ...
    @property
    def seeds(self) -> NDArray[np.uint64]: ...
    def predicted_gradient(self, i: int) -> NDArray[np.float32]: ...
