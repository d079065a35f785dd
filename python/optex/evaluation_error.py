"""optex.EvaluationError: a worker could not deliver an evaluation of :func:`optex.minimize`."""

from __future__ import annotations

from typing import Any


class EvaluationError(RuntimeError):
    """The executor failed to evaluate a point (not the objective: its exceptions propagate).

    Raised by :func:`optex.minimize` when submitting to the executor fails (it
    was shut down), or a future ends without a result: its worker died, the
    objective or its arguments could not be pickled for that executor, or the
    future was cancelled. The original error is ``__cause__``.

    The engine is left as it was before the round's evaluations, its round
    still pending: ``optex.minimize(fun_and_grad, err.engine, ...)`` retries the
    round (the same points and seeds) and continues the run.
    """

    def __init__(self, message: str, *, point: int, iteration: int, engine: Any) -> None:
        super().__init__(message)
        self.point = point
        """The index of the point whose evaluation failed (the lowest, when several did)."""
        self.iteration = iteration
        """The engine's pending iteration (``OptEx.iteration``) the point belongs to."""
        self.engine = engine
        """The :class:`optex.OptEx`, unchanged, with the round pending."""
