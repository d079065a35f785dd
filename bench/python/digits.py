"""scikit-learn's bundled digits data set, two classifiers and their minibatch objective.

Data: ``sklearn.datasets.load_digits`` (1797 8x8 images, 10 classes, shipped
with scikit-learn: no download), pixels scaled to [0, 1], split once into 75%
train and 25% test, stratified, with a fixed split seed (0) shared by every run.

Models (parameters are one flat float32 vector, row-major, concatenated):

- ``SoftmaxRegression``: logits = W x + b; W (10 x 64), b (10). Starts at zero.
- ``Mlp``: logits = W2 tanh(W1 x + b1) + b2; hidden 32 by default. Glorot-normal
  weights from the run seed, zero biases.

Loss: the mean cross-entropy over the examples. ``MinibatchObjective(model,
batch_size)(params, seed)`` draws ``batch_size`` training examples without
replacement with ``numpy.random.default_rng(seed)`` and returns that
minibatch's loss and gradient.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

import two_layer
from methods import Evaluation

SPLIT_SEED = 0
TEST_FRACTION = 0.25


@functools.lru_cache(maxsize=1)
def load_split() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): float64 features in [0, 1], int labels."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    features = data.data / 16.0
    x_train, x_test, y_train, y_test = train_test_split(
        features, data.target, test_size=TEST_FRACTION, stratify=data.target, random_state=SPLIT_SEED
    )
    return x_train, y_train, x_test, y_test


def _cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy and its gradient with respect to the logits."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    probabilities = exp / exp.sum(axis=1, keepdims=True)
    rows = np.arange(len(labels))
    loss = float(np.mean(np.log(exp.sum(axis=1)) - shifted[rows, labels]))
    dlogits = probabilities
    dlogits[rows, labels] -= 1.0
    return loss, dlogits / len(labels)


@dataclasses.dataclass(frozen=True)
class SoftmaxRegression:
    """Multinomial logistic regression."""

    n_features: int = 64
    n_classes: int = 10

    @property
    def size(self) -> int:
        return (self.n_features + 1) * self.n_classes

    def initial_params(self, rng: np.random.Generator) -> np.ndarray:
        del rng  # a convex model: start at zero
        return np.zeros(self.size, dtype=np.float32)

    def _unpack(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = np.asarray(params, dtype=np.float64)
        split = self.n_features * self.n_classes
        return p[:split].reshape(self.n_classes, self.n_features), p[split:]

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        weights, bias = self._unpack(params)
        return x @ weights.T + bias

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over (x, y) and its gradient, float64 (size,)."""
        loss, dlogits = _cross_entropy(self.logits(params, x), y)
        return loss, np.concatenate([(dlogits.T @ x).ravel(), dlogits.sum(axis=0)])


@dataclasses.dataclass(frozen=True)
class Mlp:
    """One tanh hidden layer."""

    n_features: int = 64
    hidden: int = 32
    n_classes: int = 10

    @property
    def size(self) -> int:
        return two_layer.size(self.n_features, self.hidden, self.n_classes)

    def initial_params(self, rng: np.random.Generator) -> np.ndarray:
        f, h, c = self.n_features, self.hidden, self.n_classes
        w1 = rng.normal(0.0, np.sqrt(2.0 / (f + h)), size=(h, f))
        w2 = rng.normal(0.0, np.sqrt(2.0 / (h + c)), size=(c, h))
        return np.concatenate([w1.ravel(), np.zeros(h), w2.ravel(), np.zeros(c)]).astype(np.float32)

    def _unpack(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return two_layer.unpack(params, self.n_features, self.hidden, self.n_classes)

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        w1, b1, w2, b2 = self._unpack(params)
        return np.tanh(x @ w1.T + b1) @ w2.T + b2

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray]:
        """Mean cross-entropy over (x, y) and its gradient, float64 (size,)."""
        w1, b1, w2, b2 = self._unpack(params)
        hidden = np.tanh(x @ w1.T + b1)
        loss, dlogits = _cross_entropy(hidden @ w2.T + b2, y)
        dhidden = (dlogits @ w2) * (1.0 - hidden**2)
        parts = [(dhidden.T @ x).ravel(), dhidden.sum(axis=0), (dlogits.T @ hidden).ravel(), dlogits.sum(axis=0)]
        return loss, np.concatenate(parts)


Model = SoftmaxRegression | Mlp


def loss_and_accuracy(model: Model, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``params`` on (x, y)."""
    logits = model.logits(params, x)
    loss, _ = _cross_entropy(logits, y)
    return loss, float(np.mean(np.argmax(logits, axis=1) == y))


@dataclasses.dataclass(frozen=True)
class MinibatchObjective:
    """The loss and gradient on ``batch_size`` training examples drawn by the seed."""

    model: Model
    batch_size: int

    def warm_up(self) -> None:
        """Loads the data (in a worker process, before any timed round)."""
        load_split()

    def __call__(self, params: np.ndarray, seed: int) -> Evaluation:
        x_train, y_train, _, _ = load_split()
        rng = np.random.default_rng(seed)
        rows = rng.choice(len(y_train), size=min(self.batch_size, len(y_train)), replace=False)
        loss, grad = self.model.loss_and_grad(params, x_train[rows], y_train[rows])
        return Evaluation(loss, grad.astype(np.float32))
