"""optex: the OptEx parallel optimizer (Shu, Fang, He, Yu, NeurIPS 2024).

Kernel regression over the history of evaluated gradients predicts the next N-1
gradients; the base optimizer (SGD, Adam) takes N-1 cheap proxy steps with them,
and the N true gradients at those points are evaluated at once on N workers.

    import optex
    opt = optex.OptEx(x0, optimizer=optex.Adam(lr=1e-2), parallelism=4)
    points = opt.ask()              # (N, d) float32, a read-only view
    opt.tell(grads, losses)         # (N, d), (N,)
    res = optex.minimize(fun_and_grad, x0, parallelism=4)   # threads or processes

The compiled core lives in optex._optex; everything public is re-exported here.
"""

from . import problems
from .minimize import OptimizeResult, minimize
from ._optex import (
    Adam,
    AdamW,
    IterationInfo,
    OptEx,
    Options,
    Sgd,
    __version__,
    built_with_cuda,
    cuda_device_count,
)

__all__ = [
    "Adam",
    "AdamW",
    "IterationInfo",
    "OptEx",
    "OptimizeResult",
    "Options",
    "Sgd",
    "__version__",
    "built_with_cuda",
    "cuda_device_count",
    "minimize",
    "problems",
]
