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

This package needs PyTorch; ``import optex`` does not import it (``optex.torch``
imports it when first accessed). Everything here is pure Python on top of the
compiled engine ``optex.OptEx``, one concern per module: optimizer.py (the
``OptEx`` facade), argument_checks.py (its constructor's and add_param_group's
arguments), engine_lifecycle.py (the engine created, rebuilt, kept on
schedule), step.py (one round), point_batches.py (``PointBatches``: a minibatch
for every evaluation), batched.py (``BatchedClosure``: the N evaluations of a
round in one vectorized call), hyperparameters.py, layout.py (the flat parameter
vector), trainable.py (which parameters the engine optimizes),
committed_buffers.py, state_dict.py (``state_dict`` and ``load_state_dict``),
checkpoint.py (the ``state_dict`` format), state_dict_checks.py (what loads),
pickling.py (pickle, deepcopy, torch.save), closure.py and exchange.py
(torch.distributed), sharded.py (``shard_state=True``: each rank keeps a slice
of the state).
"""

try:
    # PyTorch itself (an absolute import), before any module here needs it, so
    # that a missing torch gives this message rather than a bare ModuleNotFoundError.
    import torch as _torch  # noqa: F401
    import torch.distributed as _dist  # noqa: F401
except ImportError as _error:  # pragma: no cover - exercised by a subprocess test
    raise ImportError(
        "optex.torch needs PyTorch, which is not installed (or failed to import: "
        f"{_error}). Install it with `pip install torch` (or `pip install optex[torch]`); "
        "the rest of optex (optex.OptEx, optex.minimize) works without it."
    ) from _error

from .batched import BatchedClosure
from .optimizer import OptEx
from .point_batches import PointBatches

__all__ = ["BatchedClosure", "OptEx", "PointBatches"]
