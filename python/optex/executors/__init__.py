"""Executors for :func:`optex.minimize`'s ``workers=`` beyond threads and processes.

``minimize(..., workers=executor)`` takes any ``concurrent.futures.Executor``:
Dask's ``distributed.Client(...).get_executor()``, ``mpi4py.futures.MPIPoolExecutor``,
loky, or one of your own. This package adds the two the standard library and
those engines do not give:

- :class:`RayExecutor`: Ray tasks behind the Executor interface (``import ray``
  happens when one is made, never at ``import optex``).
- :class:`VirtualClockExecutor`: N simulated workers with scripted or random
  evaluation times on a virtual clock, for testing and benchmarking what
  ``min_results`` and ``round_timeout`` do with stragglers, in seconds of real time.

The virtual-time protocol. An executor that simulates time offers two methods,
and :func:`optex.minimize` then uses them instead of the real clock:

- ``virtual_time() -> float``: the executor's clock, in seconds;
- ``wait_virtual(fs, timeout=None, return_when=FIRST_COMPLETED) -> (done, not_done)``:
  ``concurrent.futures.wait``'s contract, advancing the clock instead of sleeping.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RayExecutor", "VirtualClockExecutor"]


def __getattr__(name: str) -> Any:
    """Each executor's module is imported on first use."""
    if name == "RayExecutor":
        from .ray_executor import RayExecutor

        return RayExecutor
    if name == "VirtualClockExecutor":
        from .virtual_clock import VirtualClockExecutor

        return VirtualClockExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
