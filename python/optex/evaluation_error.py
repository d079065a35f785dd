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


class NonFiniteRoundError(EvaluationError):
    """No evaluation of a round can be committed: each of its N pairs has a non-finite
    loss or gradient (or one above the magnitude bound, or a step to a non-finite
    iterate), so that ``tell(..., drop_nonfinite=True)`` has nothing to step from.

    Raised by :func:`optex.minimize` instead of losing the run: the engine is left
    as it was before the round, its round still pending (``point`` is 0, every
    point's pair being unusable; ``iteration`` the pending one), and
    ``optex.minimize(fun_and_grad, err.engine, ...)`` evaluates the same points
    with the same seeds again and continues, as after an EvaluationError. The
    engine's own refusal (a RuntimeError) is ``__cause__``.
    """


class ExecutorContractError(EvaluationError, TypeError):
    """The executor broke the ``concurrent.futures`` contract: its ``submit`` returned
    something that is not a ``concurrent.futures.Future``, or a future's result is
    not the evaluation optex submitted (None, a bare loss, another object).

    Raised by :func:`optex.minimize` before anything is read from that result, with
    a message naming the executor's type, the point and what it returned. A
    TypeError (the executor handed back the wrong type) and an EvaluationError:
    the engine is unchanged with its round pending (``err.engine``), so that
    ``optex.minimize(fun_and_grad, err.engine, workers=another_executor, ...)``
    continues the run. A late result of a committed round that breaks the
    contract raises it too, after that round's commit (no round is pending then).
    """
