"""The flat parameter layout of the two-layer networks of the runners.

Both the MLP policy (policies.py) and the MLP classifier (digits.py) compute
``W2 tanh(W1 x + b1) + b2`` from one flat vector laid out row-major as W1
(hidden x inputs), b1 (hidden), W2 (outputs x hidden), b2 (outputs).
"""

from __future__ import annotations

import numpy as np


def size(inputs: int, hidden: int, outputs: int) -> int:
    """Number of parameters."""
    return hidden * (inputs + 1) + outputs * (hidden + 1)


def unpack(params: np.ndarray, inputs: int, hidden: int,
           outputs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(W1, b1, W2, b2) as float64 views of ``params``."""
    p = np.asarray(params, dtype=np.float64)
    i = 0
    w1 = p[i : i + hidden * inputs].reshape(hidden, inputs)
    i += hidden * inputs
    b1 = p[i : i + hidden]
    i += hidden
    w2 = p[i : i + outputs * hidden].reshape(outputs, hidden)
    i += outputs * hidden
    return w1, b1, w2, p[i : i + outputs]
