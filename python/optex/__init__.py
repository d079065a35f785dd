"""optex: the OptEx parallel optimizer (Shu, Fang, He, Yu, NeurIPS 2024).

Kernel regression over the history of evaluated gradients predicts the next N-1
gradients; the base optimizer (SGD, Adam) takes N-1 cheap proxy steps with them,
and the N true gradients at those points are evaluated at once on N workers.

    import optex
    opt = optex.OptEx(x0, optimizer=optex.Adam(lr=1e-2), parallelism=4)
    points = opt.ask()              # (N, d) float32, a read-only view
    opt.tell(grads, losses)         # (N, d), (N,)
    res = optex.minimize(fun_and_grad, x0, parallelism=4)   # threads, processes, any Executor

The compiled core lives in optex._optex; everything public is re-exported here.
PyTorch users: ``optex.torch.OptEx`` is a ``torch.optim.Optimizer`` (``import
optex.torch``, or just access ``optex.torch``); ``import optex`` itself never
imports torch.
"""

import typing as _typing

from . import executors, problems
from .evaluation_error import EvaluationError, ExecutorContractError, NonFiniteRoundError
from .minimize import OptimizeResult, minimize
# Everything the compiled module offers (the engine, options, arrays, the base
# optimizer classes it registers from each optimizer's own description, ...).
from ._optex import *  # noqa: F401,F403
from ._optex import __all__ as _compiled_names
from ._optex import __version__

__all__ = sorted([*_compiled_names, "EvaluationError", "ExecutorContractError",
                  "NonFiniteRoundError", "OptimizeResult", "__version__", "executors",
                  "minimize", "problems"])


if _typing.TYPE_CHECKING:
    from . import torch as torch


def __getattr__(name: str) -> _typing.Any:
    """``optex.torch`` imports the PyTorch integration (and torch) on first access."""
    if name == "torch":
        import importlib

        return importlib.import_module(".torch", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
