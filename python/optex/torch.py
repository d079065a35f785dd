"""optex.torch: OptEx as a ``torch.optim.Optimizer``.

    import optex.torch

    opt = optex.torch.OptEx(model.parameters(), optimizer="adam", lr=1e-3, parallelism=4)

    def closure():
        opt.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        return loss

    for _ in range(rounds):
        loss = opt.step(closure)   # evaluates the closure at the N points of one round

``step(closure)`` follows the closure protocol of ``torch.optim.LBFGS``: the
closure zeroes the gradients, computes the loss, calls ``backward()`` and
returns the loss. One step is one OptEx round (DESIGN.md section 2): the engine
proposes N points, the closure is evaluated at each of them, and the engine
commits the new iterate, which ``step`` writes into the parameters.

This module needs PyTorch; ``import optex`` does not import it (``optex.torch``
imports it when first accessed). Everything here is pure Python on top of the
compiled engine ``optex.OptEx``.
"""

from __future__ import annotations

import hashlib
import numbers
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Any, Literal, Union

import numpy as np

try:
    # An absolute import: the top-level PyTorch package, not this module.
    import torch
    import torch.distributed as _dist
except ImportError as _error:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "optex.torch needs PyTorch, which is not installed (or failed to import: "
        f"{_error}). Install it with `pip install torch` (or `pip install optex[torch]`); "
        "the rest of optex (optex.OptEx, optex.minimize) works without it."
    ) from _error

from ._optex import Adam, AdamW, IterationInfo, Options, Sgd, built_with_cuda
from ._optex import OptEx as _Engine

__all__ = ["OptEx"]

_OPTIMIZERS = ("adam", "adamw", "sgd")
# The hyperparameters each optimizer reads from a param group, in torch.optim's names.
_GROUP_KEYS = {
    "adam": ("lr", "betas", "eps", "weight_decay"),
    "adamw": ("lr", "betas", "eps", "weight_decay"),
    "sgd": ("lr", "momentum", "nesterov", "weight_decay"),
}
# The fields of optex.Options that OptEx accepts as keyword arguments.
_OPTION_FIELDS = (
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
# The key of the engine checkpoint in state_dict()["state"][0].
_CHECKPOINT_KEY = "optex_checkpoint"

Closure = Callable[[], Any]
ParamsT = Union[Iterable[torch.Tensor], Iterable[dict[str, Any]]]


def _real(name: str, value: Any) -> float:
    """A hyperparameter as a float (Python numbers and one-element tensors)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name}: must be a number, got a tensor of shape {tuple(value.shape)}")
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name}: must be a real number, got {value!r}")
    return float(value)


def _block(n: int, world: int, rank: int) -> range:
    """The points of rank `rank` among `world`: contiguous blocks, the first n % world ranks
    one more (the split of the C++ DistributedEngine)."""
    base, extra = divmod(n, world)
    first = rank * base + min(rank, extra)
    return range(first, first + base + (1 if rank < extra else 0))


class OptEx(torch.optim.Optimizer):
    """OptEx (Shu, Fang, He, Yu, NeurIPS 2024) as a ``torch.optim.Optimizer``.

    ``OptEx(params, optimizer="adam", lr=1e-3, ..., parallelism=4, ...)``

    **Base optimizer.** ``optimizer`` is "adam", "adamw" or "sgd", with
    torch.optim's hyperparameter names and defaults: ``lr`` (1e-3), ``betas``
    ((0.9, 0.999)), ``eps`` (1e-8), ``weight_decay`` (0; 1e-2 for "adamw") for
    Adam and AdamW; ``lr``, ``momentum`` (0), ``nesterov`` (False),
    ``weight_decay`` (0) for SGD. Passing a hyperparameter that the chosen
    optimizer does not use (``momentum`` with Adam, ``betas`` with SGD) raises
    ValueError. The update rules are the engine's (``optex.Adam`` etc., PyTorch
    semantics; torch's ``amsgrad``, ``maximize``, ``dampening`` are not offered).

    **OptEx options.** ``parallelism`` (N), ``history``, ``kernel``,
    ``lengthscale``, ``noise``, ``input_scaling``, ``warmup``,
    ``lengthscale_selection``, ``selection_interval``, ``lengthscale_grid``,
    ``proxy``, ``seed``, ``device`` and ``history_precision`` set the fields of
    ``optex.Options`` (defaults: the C++ ones); ``options`` passes a whole
    ``optex.Options`` that the keywords then override. ``device=None`` (the
    default) runs the engine where the parameters live: "cuda:k" for
    parameters on GPU k when ``optex.built_with_cuda()``, "cpu" otherwise.

    **step(closure).** The closure protocol of ``torch.optim.LBFGS``: the
    closure zeroes the gradients, computes the loss, calls ``backward()`` and
    returns the loss. A step is one OptEx round: the engine's ``ask()`` gives N
    points; for each, ``step`` writes the point into the parameters, sets their
    ``.grad`` to None, calls the closure and reads the gradients (a parameter
    whose ``.grad`` is still None contributes a zero gradient; unlike
    torch.optim, which skips such a parameter, the engine then still applies
    weight decay to it). Then it restores the parameters, ``tell()``s the
    engine the N gradients and losses, and writes the committed iterate into
    the parameters. It returns the closure's loss at the committed point (the
    last point of the round unless points were dropped). While the closure
    runs, :attr:`current_point` and :attr:`current_seed` say which point it is
    evaluating and that point's own reproducible seed (for its minibatch).
    Without torch.distributed, the N evaluations run one after the other in
    this process: the trajectory is OptEx's (fewer rounds), the wall-clock
    speedup needs N workers (see below). After ``step``, ``.grad`` holds the
    gradient of the last point this process evaluated.

    **Parameter layout.** All parameters of all param groups form one float32
    vector for one engine, in the order param groups, then the parameters of
    each group, each flattened in row-major order. The engine works in
    float32: parameters of another floating dtype hold the engine's float32
    values cast to their dtype, and their gradients are rounded to float32.
    All parameters must be on one device.

    **Param groups.** The engine runs ONE base optimizer over the whole
    vector, so every param group must have the same hyperparameters (``lr``
    and the others of the chosen optimizer); a group that differs raises
    ValueError naming the group and the setting (per-group values, such as
    no weight decay on biases, are not supported). Groups still work for
    organising parameters. ``add_param_group`` works until the first
    ``step``; afterwards the engine's dimension is fixed and it raises
    RuntimeError.

    **LR schedulers.** Hyperparameters changed between steps (by a
    ``torch.optim.lr_scheduler``, or by hand in every group alike) take
    effect at the next ``step``, and the engine keeps its state (moments,
    step count, history), as ``optex.OptEx.set_optimizer``. SGD momentum
    cannot switch between zero and non-zero during a run (ValueError).

    **The iterate belongs to the engine.** The engine is created at the first
    ``step`` from the parameters' values then (so weights loaded after the
    optimizer was constructed are used). Afterwards ``step`` checks that the
    parameters still hold the committed iterate and raises RuntimeError if
    they were changed outside ``step`` (the engine cannot adopt a new
    iterate without losing its history).

    **Checkpoints.** ``state_dict()`` has torch.optim's shape: ``{"state":
    {0: {"optex_checkpoint": bytes, "iteration": int}}, "param_groups":
    [...]}``, the bytes being the engine's checkpoint (``optex.OptEx.save``:
    iterate, optimizer state, history, random state, options). The state is
    empty before the first step. ``load_state_dict`` restores it, and the run
    continues bit for bit. ``state_dict()`` raises RuntimeError after a step
    that failed mid-round (the round is still pending; call ``step`` again to
    finish it first).

    **torch.distributed.** When ``torch.distributed`` is initialised (or
    ``distributed=True``), the ranks of ``process_group`` (default: the world)
    share the work of a round: rank r evaluates a contiguous block of the N
    points (N // W each, the first N % W ranks one more, as the C++
    DistributedEngine), the gradients (float32) and losses (float64) are
    all-gathered, and every rank tells its engine the same full batch, so the
    engines stay identical and the result is bit for bit the single-process
    one. At the first step the ranks check that they agree on the
    hyperparameters, options and dimension, and take rank 0's parameter
    values as the start. With the "nccl" backend the exchange uses tensors on
    the parameters' GPU, otherwise CPU tensors. A closure that raises on one
    rank makes every rank raise RuntimeError (naming the rank) instead of
    hanging. Pass ``distributed=False`` to let every rank evaluate all N
    points itself (e.g. when the closure's backward already all-reduces, as
    under DistributedDataParallel).

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
        optimizer: Literal["adam", "adamw", "sgd"] = "adam",
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
        seed: int | None = None,
        device: str | torch.device | None = None,
        history_precision: str | None = None,
        drop_nonfinite: bool = False,
        distributed: bool | None = None,
        process_group: Any = None,
    ) -> None:
        if not isinstance(optimizer, str) or optimizer not in _OPTIMIZERS:
            raise ValueError(
                f"optimizer: must be one of {', '.join(repr(o) for o in _OPTIMIZERS)}, "
                f"got {optimizer!r}"
            )
        given = {"betas": betas, "eps": eps, "momentum": momentum, "nesterov": nesterov}
        for name, value in given.items():
            if value is not None and name not in _GROUP_KEYS[optimizer]:
                raise ValueError(
                    f"{name}: not a hyperparameter of optimizer={optimizer!r} "
                    f"(it takes {', '.join(_GROUP_KEYS[optimizer])}), got {value!r}"
                )
        if optimizer == "sgd":
            defaults: dict[str, Any] = {
                "lr": lr,
                "momentum": 0.0 if momentum is None else momentum,
                "nesterov": False if nesterov is None else nesterov,
                "weight_decay": 0.0 if weight_decay is None else weight_decay,
            }
        else:
            defaults = {
                "lr": lr,
                "betas": (0.9, 0.999) if betas is None else betas,
                "eps": 1e-8 if eps is None else eps,
                "weight_decay": (0.01 if optimizer == "adamw" else 0.0)
                if weight_decay is None
                else weight_decay,
            }
        self._kind = optimizer
        # Validates the defaults with their own names (before any group exists).
        self._make_optimizer(defaults, where="")

        self._options = self._make_options(
            options,
            {
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
                "seed": seed,
                "history_precision": history_precision,
            },
        )
        if device is not None and not isinstance(device, (str, torch.device)):
            raise ValueError(f"device: must be a str, a torch.device or None, got {device!r}")
        self._device: str | None = None if device is None else str(device)
        if not isinstance(drop_nonfinite, bool):
            raise ValueError(f"drop_nonfinite: must be a bool, got {drop_nonfinite!r}")
        self._drop_nonfinite = drop_nonfinite
        if distributed is not None and not isinstance(distributed, bool):
            raise ValueError(f"distributed: must be a bool or None, got {distributed!r}")
        if distributed and not (_dist.is_available() and _dist.is_initialized()):
            raise ValueError(
                "distributed: True needs an initialised torch.distributed "
                "(torch.distributed.init_process_group)"
            )
        self._distributed_flag = distributed
        self._group = process_group

        self._engine: _Engine | None = None
        self._iterate: torch.Tensor | None = None  # the committed iterate, float32, on the params' device
        self._layout: list[tuple[torch.Tensor, int, int]] = []
        self._buffers: dict[str, torch.Tensor] = {}
        self._last_info: IterationInfo | None = None
        self._current_point: int | None = None
        self._current_seed: int | None = None
        self._constructed = False

        super().__init__(params, defaults)
        self._constructed = True
        if not self._params():
            raise ValueError("params: the param groups contain no parameters")
        if sum(p.numel() for p in self._params()) == 0:
            raise ValueError("params: the parameters have no elements")
        # Validates the options, the hyperparameters and the device now, with a
        # one-dimensional engine; the real one is created at the first step.
        _Engine(np.zeros(1, np.float32), self._make_optimizer(self.param_groups[0], where=""),
                self._options_on(self._engine_device()))

    # ------------------------------------------------------------------ properties

    @property
    def engine(self) -> _Engine | None:
        """The underlying ``optex.OptEx`` engine (None before the first step), for
        inspection (``iteration``, ``lengthscale``, ``options``...). Calling its
        ``ask``/``tell`` directly desynchronises this optimizer."""
        return self._engine

    @property
    def last_info(self) -> IterationInfo | None:
        """The ``optex.IterationInfo`` of the last step (loss, gradient norm, the mean
        cosine between predicted and true gradients, lengthscale...); None before."""
        return self._last_info

    @property
    def current_point(self) -> int | None:
        """While the closure runs inside ``step``: the index (0..N-1) of the point it
        is evaluating; None otherwise (and during proxy='target' oracle calls)."""
        return self._current_point

    @property
    def current_seed(self) -> int | None:
        """While the closure runs inside ``step``: the point's own seed (the engine's
        ``seeds[i]``; the run's seed during proxy='target' oracle calls), the same
        on every run and every rank: use it to draw the point's minibatch."""
        return self._current_seed

    @property
    def parallelism(self) -> int:
        """N, the number of points of each round."""
        return int(self._engine.parallelism if self._engine is not None else self._options.parallelism)

    # ------------------------------------------------------------------ validation

    def _make_optimizer(self, group: dict[str, Any], where: str) -> Sgd | Adam | AdamW:
        """The engine's optimizer value for a group's (or the defaults') hyperparameters;
        ValueError naming `where` and the setting."""
        try:
            lr = _real("lr", group["lr"])
            wd = _real("weight_decay", group["weight_decay"])
            if self._kind == "sgd":
                nesterov = group["nesterov"]
                if not isinstance(nesterov, bool):
                    raise ValueError(f"nesterov: must be a bool, got {nesterov!r}")
                return Sgd(lr=lr, momentum=_real("momentum", group["momentum"]),
                           nesterov=nesterov, weight_decay=wd)
            betas = group["betas"]
            if not (isinstance(betas, (tuple, list)) and len(betas) == 2):
                raise ValueError(f"betas: must be a pair (beta1, beta2), got {betas!r}")
            beta1, beta2 = _real("betas[0]", betas[0]), _real("betas[1]", betas[1])
            eps = _real("eps", group["eps"])
            kind = AdamW if self._kind == "adamw" else Adam
            try:
                return kind(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=wd)
            except ValueError as error:  # name torch's 'betas' for the engine's beta1/beta2
                text = str(error)
                for engine_name, torch_name in (("beta1", "betas[0]"), ("beta2", "betas[1]")):
                    if text.startswith(engine_name + ":"):
                        text = torch_name + text[len(engine_name):]
                raise ValueError(text) from None
        except ValueError as error:
            raise ValueError(f"{where}{error}") from None

    @staticmethod
    def _make_options(options: Options | None, fields: dict[str, Any]) -> Options:
        if options is not None and not isinstance(options, Options):
            raise ValueError(f"options: must be an optex.Options or None, got {type(options).__name__}")
        result = Options() if options is None else _copy_options(options)
        for name, value in fields.items():
            if value is None:
                continue
            try:
                setattr(result, name, value)
            except (TypeError, ValueError) as error:
                text = str(error)
                raise ValueError(text if text.startswith(name) else f"{name}: {text}") from None
        return result

    def _settings(self, group: dict[str, Any]) -> tuple:
        """The group's hyperparameters as comparable values."""
        out = []
        for key in _GROUP_KEYS[self._kind]:
            value = group[key]
            if key == "betas":
                value = tuple(_real(key, v) for v in value)
            elif key != "nesterov":
                value = _real(key, value)
            out.append((key, value))
        return tuple(out)

    def _check_groups(self) -> Sgd | Adam | AdamW:
        """Every group has group 0's hyperparameters; returns the engine optimizer."""
        optimizer = self._make_optimizer(self.param_groups[0], where="param_groups[0]: ")
        first = dict(self._settings(self.param_groups[0]))
        for g, group in enumerate(self.param_groups[1:], start=1):
            self._make_optimizer(group, where=f"param_groups[{g}]: ")
            for key, value in self._settings(group):
                if value != first[key]:
                    raise ValueError(
                        f"param_groups[{g}]['{key}']: {group[key]!r} differs from "
                        f"param_groups[0]['{key}'] = {self.param_groups[0][key]!r}; "
                        "optex.torch.OptEx runs one base optimizer over all parameters, so "
                        f"every param group must have the same {', '.join(_GROUP_KEYS[self._kind])}"
                    )
        return optimizer

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Adds a param group (torch.optim's contract). Its hyperparameters must equal
        the other groups' (ValueError naming the group and the setting otherwise).
        Works until the first ``step``; afterwards the engine's dimension is fixed and
        this raises RuntimeError."""
        if self._constructed and self._engine is not None:
            raise RuntimeError(
                "add_param_group: not supported after the first step (or load_state_dict): "
                "the OptEx engine's dimension is fixed; construct a new optimizer with all "
                "parameters instead"
            )
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        g = len(self.param_groups) - 1
        params = group["params"]
        try:
            if len(params) != len({id(p) for p in params}):
                raise ValueError(f"param_groups[{g}]: contains the same parameter twice")
            for j, p in enumerate(params):
                if not p.is_floating_point():
                    raise ValueError(
                        f"param_groups[{g}]['params'][{j}]: must be a floating-point tensor, "
                        f"got dtype {p.dtype}"
                    )
                if p.is_sparse:
                    raise ValueError(f"param_groups[{g}]['params'][{j}]: sparse tensors are not supported")
            first = self._params()[0] if self._params() else None
            for j, p in enumerate(params):
                if first is not None and p.device != first.device:
                    raise ValueError(
                        f"param_groups[{g}]['params'][{j}]: on {p.device}, but the first "
                        f"parameter is on {first.device}; all parameters of an "
                        "optex.torch.OptEx must be on one device"
                    )
            self._check_groups()
        except ValueError:
            self.param_groups.pop()
            raise

    # ------------------------------------------------------------------ layout and devices

    def _params(self) -> list[torch.Tensor]:
        return [p for group in self.param_groups for p in group["params"]]

    def _make_layout(self) -> list[tuple[torch.Tensor, int, int]]:
        layout = []
        offset = 0
        for p in self._params():
            layout.append((p, offset, p.numel()))
            offset += p.numel()
        if offset == 0:
            raise ValueError("params: the parameters have no elements")
        return layout

    def _param_device(self) -> torch.device:
        return self._params()[0].device

    def _engine_device(self) -> str:
        """The engine's device: the one asked for, else the parameters'."""
        if self._device is not None:
            return self._device
        dev = self._param_device()
        if dev.type == "cuda" and built_with_cuda():
            return f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
        return "cpu"

    def _options_on(self, device: str) -> Options:
        options = _copy_options(self._options)
        try:
            options.device = device
        except (TypeError, ValueError) as error:
            text = str(error)
            raise ValueError(text if text.startswith("device") else f"device: {text}") from None
        return options

    def _flat_params(self) -> torch.Tensor:
        """The parameters as one float32 vector on their device (a new tensor)."""
        flat = torch.empty(self._layout[-1][1] + self._layout[-1][2], dtype=torch.float32,
                           device=self._param_device())
        with torch.no_grad():
            for p, offset, n in self._layout:
                flat[offset:offset + n].copy_(p.reshape(-1))
        return flat

    def _write_params(self, flat: torch.Tensor) -> None:
        with torch.no_grad():
            for p, offset, n in self._layout:
                p.copy_(flat[offset:offset + n].view(p.shape))

    def _read_grads(self, out: torch.Tensor) -> None:
        for p, offset, n in self._layout:
            g = p.grad
            if g is None:
                out[offset:offset + n].zero_()
            elif g.is_sparse:
                raise ValueError("closure: produced a sparse gradient; optex.torch.OptEx needs dense gradients")
            else:
                out[offset:offset + n].copy_(g.reshape(-1))

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        """A cached scratch tensor (pinned host memory when the parameters are on a GPU)."""
        buf = self._buffers.get(name)
        if buf is None or buf.shape != shape or buf.dtype != dtype or buf.device != device:
            pin = device.type == "cpu" and self._param_device().type == "cuda"
            buf = torch.empty(shape, dtype=dtype, device=device, pin_memory=pin)
            self._buffers[name] = buf
        return buf

    # ------------------------------------------------------------------ distribution

    def _is_distributed(self) -> bool:
        if self._distributed_flag is False:
            return False
        return bool(_dist.is_available() and _dist.is_initialized())

    def _comm_device(self) -> torch.device:
        """Where the all-gathered tensors live: the parameters' GPU with NCCL, else the CPU."""
        backend = str(_dist.get_backend(self._group)).lower()
        dev = self._param_device()
        if "nccl" in backend and dev.type == "cuda":
            return dev
        return torch.device("cpu")

    def _agree(self, optimizer: Sgd | Adam | AdamW, options: Options, dim: int) -> None:
        """At engine creation and when the hyperparameters change: every rank has the
        same optimizer, options and dimension."""
        text = f"{optimizer!r}|{_options_key(options)}|{dim}"
        digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:7], "little")
        mine = torch.tensor([digest], dtype=torch.int64, device=self._comm_device())
        world = _dist.get_world_size(self._group)
        gathered = [torch.empty_like(mine) for _ in range(world)]
        _dist.all_gather(gathered, mine, group=self._group)
        values = [int(t.item()) for t in gathered]
        if len(set(values)) != 1:
            differ = [r for r, v in enumerate(values) if v != values[0]]
            raise ValueError(
                "optex.torch.OptEx: the ranks disagree on the hyperparameters, options or the "
                f"number of parameters (ranks {differ} differ from rank 0; this rank: {text})"
            )

    # ------------------------------------------------------------------ the engine

    def _create_engine(self, optimizer: Sgd | Adam | AdamW) -> None:
        """The engine, from the parameters' values now (rank 0's when distributed)."""
        self._layout = self._make_layout()
        options = self._options_on(self._engine_device())
        x0 = self._flat_params()
        if self._is_distributed():
            self._agree(optimizer, options, x0.numel())
            comm = x0.to(self._comm_device())
            _dist.broadcast(comm, src=_dist.get_global_rank(self._group, 0)
                            if self._group is not None else 0, group=self._group)
            x0 = comm.to(x0.device)
            self._write_params(x0)
        self._engine = _Engine(x0.cpu().numpy(), optimizer, options)
        self._iterate = x0

    def _follow_schedule(self, optimizer: Sgd | Adam | AdamW) -> None:
        """The groups' hyperparameters changed since the last step (an LR scheduler):
        the engine takes them and keeps its state."""
        assert self._engine is not None
        if self._is_distributed():
            self._agree(optimizer, self._engine.options, self._engine.dim)
        try:
            self._engine.set_optimizer(optimizer)
        except ValueError as error:
            raise ValueError(
                f"step: the hyperparameters changed to {optimizer!r}, which the running engine "
                f"({self._engine.optimizer!r}) cannot take: {error}"
            ) from None

    def _check_iterate(self) -> None:
        """The parameters still hold the committed iterate."""
        assert self._iterate is not None
        with torch.no_grad():
            for j, (p, offset, n) in enumerate(self._layout):
                expected = self._iterate[offset:offset + n].view(p.shape).to(p.dtype)
                if not torch.equal(p, expected):
                    raise RuntimeError(
                        f"step: parameter {j} (in the order param groups, then parameters) no "
                        "longer holds the iterate that the last step (or load_state_dict) "
                        "committed: it was changed outside step(). The OptEx engine owns the "
                        "iterate and cannot adopt new values without losing its history; "
                        "restore the values (e.g. load the matching model checkpoint) or "
                        "construct a new optimizer"
                    )

    def _evaluate(self, closure: Closure, point: torch.Tensor, grad_out: torch.Tensor) -> tuple[Any, float]:
        """Writes `point` (float32, on the params' device) into the parameters, calls the
        closure, writes the gradient into `grad_out`; returns (closure's value, loss)."""
        self._write_params(point)
        for p, _, _ in self._layout:
            p.grad = None
        with torch.enable_grad():
            result = closure()
        if result is None:
            raise ValueError(
                "closure: returned None; it must return the loss (the closure zeroes the "
                "gradients, computes the loss, calls loss.backward() and returns the loss)"
            )
        if isinstance(result, torch.Tensor):
            if result.numel() != 1:
                raise ValueError(
                    f"closure: must return a scalar loss, got a tensor of shape {tuple(result.shape)}"
                )
            loss = float(result.detach().item())
        elif isinstance(result, numbers.Real) and not isinstance(result, bool):
            loss = float(result)
        else:
            raise ValueError(f"closure: must return the loss (a scalar tensor or a float), got {result!r}")
        self._read_grads(grad_out)
        return result, loss

    def _oracle(self, closure: Closure, seed: int, x: np.ndarray) -> tuple[float, np.ndarray]:
        """The true gradient for proxy='target', called by the engine inside ask()
        (`seed`: the run's seed)."""
        dev = self._param_device()
        point = torch.from_numpy(x).to(dev)
        grad = torch.empty_like(point)
        self._current_point, self._current_seed = None, seed
        try:
            _, loss = self._evaluate(closure, point, grad)
        finally:
            self._current_point = self._current_seed = None
        return loss, grad.cpu().numpy()

    @torch.no_grad()
    def step(self, closure: Closure | None = None) -> Any:  # type: ignore[override]
        """One OptEx round: evaluates ``closure`` at the engine's N points and commits.

        ``closure()`` must zero the gradients, compute the loss, call ``backward()``
        and return the loss (LBFGS's protocol); ``step`` calls it N times (or this
        rank's share of the N points under torch.distributed). Returns the
        closure's loss at the committed point; under torch.distributed, a rank
        that did not evaluate that point gets the gathered value (a 0-dim tensor
        of the dtype and device of its own losses, or a float).

        Raises ValueError without a closure or when the closure returns no scalar
        loss; RuntimeError when the parameters or hyperparameters were changed
        since the last step. If the closure raises, the parameters are restored
        and the round stays pending: the next ``step`` evaluates the same points.
        """
        if closure is None or not callable(closure):
            raise ValueError(
                "closure: optex.torch.OptEx.step needs a closure that zeroes the gradients, "
                "computes the loss, calls loss.backward() and returns the loss "
                f"(as torch.optim.LBFGS), got {closure!r}"
            )
        optimizer = self._check_groups()
        if self._engine is None:
            self._create_engine(optimizer)
        else:
            self._check_iterate()
            if optimizer != self._engine.optimizer:
                self._follow_schedule(optimizer)
        engine = self._engine
        assert engine is not None and self._iterate is not None
        n, d = engine.parallelism, engine.dim
        dev = self._param_device()
        host = torch.device("cpu")

        # The engine's own point and gradient rows, wrapped without a copy
        # (DLPack): on a CUDA engine they stay in GPU memory.
        target = engine.options.proxy == "target"
        if target:
            run_seed = int(engine.options.seed)
            engine.set_gradient_oracle(lambda x: self._oracle(closure, run_seed, x))
        try:
            points = torch.from_dlpack(engine.device_points())
        finally:
            if target:
                engine.set_gradient_oracle(None)
        rows = torch.from_dlpack(engine.device_grads())
        seeds = engine.seeds

        distributed = self._is_distributed()
        if distributed:
            world = _dist.get_world_size(self._group)
            rank = _dist.get_rank(self._group)
            comm_dev = self._comm_device()
        else:
            world, rank, comm_dev = 1, 0, host
        mine = _block(n, world, rank)
        width = max(len(_block(n, world, r)) for r in range(world))
        if distributed:
            grads_local = self._buffer("grads_local", (width, d), torch.float32, comm_dev)
            losses_local = torch.zeros(width + 1, dtype=torch.float64, device=comm_dev)
        else:
            grads_local = rows
            losses_local = torch.zeros(n + 1, dtype=torch.float64)
        scratch_point = self._buffer("point", (d,), torch.float32, dev) if points.device != dev else None
        scratch_grad = (self._buffer("grad", (d,), torch.float32, dev)
                        if grads_local.device != dev else None)

        results: dict[int, Any] = {}
        failure: BaseException | None = None
        try:
            for k, i in enumerate(mine):
                if scratch_point is not None:
                    scratch_point.copy_(points[i])
                    point = scratch_point
                else:
                    point = points[i]
                out = grads_local[k] if scratch_grad is None else scratch_grad
                self._current_point, self._current_seed = i, int(seeds[i])
                try:
                    results[i], losses_local[k] = self._evaluate(closure, point, out)
                except Exception as error:
                    if not distributed:
                        raise
                    failure = error
                    losses_local[width] = 1.0 + i  # tells the other ranks which point failed
                    break
                if scratch_grad is not None:
                    grads_local[k].copy_(scratch_grad)
        finally:
            self._current_point = self._current_seed = None
            self._write_params(self._iterate)

        if distributed:
            losses = self._gather(grads_local, losses_local, rows, world, width, failure)
        else:
            losses = losses_local[:n]
        if rows.device.type == "cuda":
            torch.cuda.synchronize(rows.device)  # the engine reads the rows on its own stream
        info = engine.tell_device(losses.numpy(), drop_nonfinite=self._drop_nonfinite)
        self._last_info = info

        # A copy: the engine rewrites its iterate in place at the next commit.
        self._iterate = torch.from_dlpack(engine.device_x()).to(dev, copy=True)
        self._write_params(self._iterate)

        c = info.committed_point
        if c in results:
            return results[c]
        like = next((r for r in results.values() if isinstance(r, torch.Tensor)), None)
        value = float(losses[c])
        if like is None:
            return value
        return torch.tensor(value, dtype=like.dtype, device=like.device)

    def _gather(self, grads_local: torch.Tensor, losses_local: torch.Tensor, rows: torch.Tensor,
                world: int, width: int, failure: BaseException | None) -> torch.Tensor:
        """All-gathers the ranks' losses (with a failure flag) and gradients; writes the
        gradients into the engine's (N, d) rows in point order and returns the (N,)
        float64 host losses."""
        n = rows.shape[0]
        gathered_losses = [torch.empty_like(losses_local) for _ in range(world)]
        _dist.all_gather(gathered_losses, losses_local, group=self._group)
        failed = [(r, int(t[width].item()) - 1) for r, t in enumerate(gathered_losses)
                  if t[width].item() != 0.0]
        if failed:
            where = ", ".join(f"rank {r} at point {i}" for r, i in failed)
            message = (f"step: the closure raised on {where}; the round stays pending and every "
                       "rank's engine is unchanged")
            if failure is not None:
                raise RuntimeError(f"{message} (this rank: {type(failure).__name__}: {failure})") from failure
            raise RuntimeError(message)
        gathered_grads = [torch.empty_like(grads_local) for _ in range(world)]
        _dist.all_gather(gathered_grads, grads_local, group=self._group)
        losses = torch.empty(n, dtype=torch.float64)
        for r in range(world):
            block = _block(n, world, r)
            if len(block) == 0:
                continue
            rows[block.start:block.stop].copy_(gathered_grads[r][:len(block)])
            losses[block.start:block.stop].copy_(gathered_losses[r][:len(block)])
        return losses

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's ``{"state": ..., "param_groups": ...}``; the state is
        ``{0: {"optex_checkpoint": bytes, "iteration": int}}`` (the engine's
        checkpoint, ``optex.OptEx.save``'s format) after the first step, ``{}``
        before. RuntimeError while a round is pending (a step failed mid-round)."""
        if self._engine is None:
            return super().state_dict()
        if self._engine.pending:
            raise RuntimeError(
                "state_dict: the last step failed mid-round and its round is still pending; "
                "call step(closure) again to finish it before saving"
            )
        with tempfile.TemporaryDirectory(prefix="optex-") as tmp:
            path = os.path.join(tmp, "engine.ckpt")
            self._engine.save(path)
            with open(path, "rb") as f:
                blob = f.read()
        first = self._params()[0]
        self.state[first] = {_CHECKPOINT_KEY: blob, "iteration": int(self._engine.iteration)}
        try:
            return super().state_dict()
        finally:
            self.state.pop(first, None)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores a ``state_dict()`` (torch.optim's contract: the param groups
        must match in number and sizes). The engine resumes from the checkpoint on
        this optimizer's device and the run continues bit for bit. The parameters
        are not changed: they must hold the checkpoint's iterate at the next step
        (load the model's matching state_dict). ValueError for a state that is not
        an optex.torch.OptEx state or whose dimension differs."""
        if not isinstance(state_dict, dict) or "state" not in state_dict or "param_groups" not in state_dict:
            raise ValueError("state_dict: expected a dict with 'state' and 'param_groups'")
        state = state_dict["state"]
        blob = None
        if state:
            entry = state.get(0) if isinstance(state, dict) else None
            if (len(state) != 1 or not isinstance(entry, dict)
                    or not isinstance(entry.get(_CHECKPOINT_KEY), (bytes, bytearray))):
                raise ValueError(
                    "state_dict: not an optex.torch.OptEx state (expected 'state' to be empty "
                    f"or {{0: {{'{_CHECKPOINT_KEY}': bytes, ...}}}}, got keys {list(state)})"
                )
            blob = bytes(entry[_CHECKPOINT_KEY])
        groups = state_dict["param_groups"]
        for g, group in enumerate(groups if isinstance(groups, list) else []):
            missing = [k for k in _GROUP_KEYS[self._kind] if not (isinstance(group, dict) and k in group)]
            if missing:
                raise ValueError(
                    f"state_dict: param_groups[{g}] has no {', '.join(missing)}: not a state of an "
                    f"optex.torch.OptEx with optimizer={self._kind!r}"
                )
        engine = None
        if blob is not None:
            device = self._engine_device()
            with tempfile.TemporaryDirectory(prefix="optex-") as tmp:
                path = os.path.join(tmp, "engine.ckpt")
                with open(path, "wb") as f:
                    f.write(blob)
                try:
                    engine = _Engine.load(path, device=device)
                except RuntimeError as error:
                    raise ValueError(f"state_dict: the engine checkpoint cannot be read: {error}") from None
            kind = {Adam: "adam", AdamW: "adamw", Sgd: "sgd"}[type(engine.optimizer)]
            if kind != self._kind:
                raise ValueError(
                    f"state_dict: saved with optimizer={kind!r}, this optimizer has "
                    f"optimizer={self._kind!r}"
                )
            layout = self._make_layout()
            dim = layout[-1][1] + layout[-1][2]
            if engine.dim != dim:
                raise ValueError(
                    f"state_dict: the checkpoint is for {engine.dim} parameters, this optimizer "
                    f"has {dim}"
                )
        super().load_state_dict(state_dict)
        self.state.clear()
        if engine is None:
            self._engine = None
            self._iterate = None
            self._last_info = None
            return
        self._layout = layout
        self._engine = engine
        self._options = engine.options
        self._iterate = torch.from_numpy(engine.x).to(self._param_device())
        self._last_info = None


def _copy_options(options: Options) -> Options:
    copy = Options()
    for name in _OPTION_FIELDS:
        setattr(copy, name, getattr(options, name))
    return copy


def _options_key(options: Options) -> str:
    """Options without the device (ranks may run their engines on different GPUs)."""
    return ",".join(f"{name}={getattr(options, name)!r}" for name in _OPTION_FIELDS if name != "device")
