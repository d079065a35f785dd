"""Stochastic policies for the RL runner, in plain numpy.

A policy maps an observation to a categorical distribution over the discrete
actions through logits computed from a flat parameter vector (the vector OptEx
optimizes). Two families:

- ``LinearSoftmaxPolicy``: logits = W s + b.
- ``MlpSoftmaxPolicy``: logits = W2 tanh(W1 s + b1) + b2 (e.g. 4-32-2 on CartPole).

Parameter layout (row-major, concatenated): W (actions x obs), b (actions) for
the linear policy; W1 (hidden x obs), b1 (hidden), W2 (actions x hidden),
b2 (actions) for the MLP.

What REINFORCE needs from a policy is ``act`` (sample one action while the
episode runs) and ``weighted_log_prob_gradient``: the gradient of
sum_t w_t log pi(a_t | s_t) over a batch of steps, computed in one vectorized
pass after the episodes. Policies are small frozen dataclasses, so they pickle
cheaply into worker processes and can key caches.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

import two_layer


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    """Row-wise softmax of a (T, A) array, shifted by the row maximum for stability."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def _sample(logits: np.ndarray, uniform: float) -> int:
    """Samples an action from softmax(logits) by inverse CDF, given a uniform draw in [0, 1).

    Plain Python floats: for a handful of actions this is several times faster
    than numpy reductions, and it runs once per environment step.
    """
    values = logits.tolist()
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    threshold = uniform * sum(weights)
    cumulative = 0.0
    last = len(weights) - 1
    for action in range(last):
        cumulative += weights[action]
        if threshold < cumulative:
            return action
    return last


@dataclasses.dataclass(frozen=True)
class LinearSoftmaxPolicy:
    """Softmax over logits W s + b."""

    obs_dim: int
    n_actions: int

    @property
    def size(self) -> int:
        """Number of parameters."""
        return (self.obs_dim + 1) * self.n_actions

    def initial_params(self, rng: np.random.Generator) -> np.ndarray:
        """Zeros: the uniform policy (``rng`` is unused, kept for a common signature)."""
        del rng
        return np.zeros(self.size, dtype=np.float32)

    def _unpack(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        p = np.asarray(params, dtype=np.float64)
        split = self.obs_dim * self.n_actions
        return p[:split].reshape(self.n_actions, self.obs_dim), p[split:]

    def prepare(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Unpacks once per evaluation; ``act`` takes the result."""
        return self._unpack(params)

    def act(self, prepared: tuple[np.ndarray, np.ndarray], obs: np.ndarray, uniform: float) -> int:
        """Samples an action for one observation, given a uniform draw in [0, 1)."""
        weights, bias = prepared
        return _sample(weights @ obs + bias, uniform)

    def logits(self, params: np.ndarray, observations: np.ndarray) -> np.ndarray:
        """Logits of a (T, obs_dim) batch: (T, n_actions)."""
        weights, bias = self._unpack(params)
        return observations @ weights.T + bias

    def weighted_log_prob_gradient(
        self, params: np.ndarray, observations: np.ndarray, actions: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """Gradient of sum_t weights[t] * log pi(actions[t] | observations[t]), float64 (size,)."""
        probabilities = _softmax_rows(self.logits(params, observations))
        # d log softmax(z)[a] / dz = onehot(a) - softmax(z)
        upstream = -probabilities
        upstream[np.arange(len(actions)), actions] += 1.0
        upstream *= weights[:, None]
        grad_weights = upstream.T @ observations
        grad_bias = upstream.sum(axis=0)
        return np.concatenate([grad_weights.ravel(), grad_bias])


@dataclasses.dataclass(frozen=True)
class MlpSoftmaxPolicy:
    """Softmax over logits W2 tanh(W1 s + b1) + b2."""

    obs_dim: int
    hidden: int
    n_actions: int

    @property
    def size(self) -> int:
        """Number of parameters."""
        return two_layer.size(self.obs_dim, self.hidden, self.n_actions)

    def initial_params(self, rng: np.random.Generator) -> np.ndarray:
        """Glorot-like hidden weights; a small output layer so the start is nearly uniform."""
        w1 = rng.normal(0.0, 1.0 / np.sqrt(self.obs_dim), size=(self.hidden, self.obs_dim))
        w2 = rng.normal(0.0, 0.01, size=(self.n_actions, self.hidden))
        parts = [w1.ravel(), np.zeros(self.hidden), w2.ravel(), np.zeros(self.n_actions)]
        return np.concatenate(parts).astype(np.float32)

    def _unpack(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return two_layer.unpack(params, self.obs_dim, self.hidden, self.n_actions)

    def prepare(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Unpacks once per evaluation; ``act`` takes the result."""
        return self._unpack(params)

    def act(self, prepared: tuple[np.ndarray, ...], obs: np.ndarray, uniform: float) -> int:
        """Samples an action for one observation, given a uniform draw in [0, 1)."""
        w1, b1, w2, b2 = prepared
        return _sample(w2 @ np.tanh(w1 @ obs + b1) + b2, uniform)

    def logits(self, params: np.ndarray, observations: np.ndarray) -> np.ndarray:
        """Logits of a (T, obs_dim) batch: (T, n_actions)."""
        w1, b1, w2, b2 = self._unpack(params)
        return np.tanh(observations @ w1.T + b1) @ w2.T + b2

    def weighted_log_prob_gradient(
        self, params: np.ndarray, observations: np.ndarray, actions: np.ndarray, weights: np.ndarray
    ) -> np.ndarray:
        """Gradient of sum_t weights[t] * log pi(actions[t] | observations[t]), float64 (size,)."""
        w1, b1, w2, b2 = self._unpack(params)
        hidden = np.tanh(observations @ w1.T + b1)
        probabilities = _softmax_rows(hidden @ w2.T + b2)
        upstream = -probabilities
        upstream[np.arange(len(actions)), actions] += 1.0
        upstream *= weights[:, None]
        grad_w2 = upstream.T @ hidden
        grad_b2 = upstream.sum(axis=0)
        # Back through tanh: d tanh(u) / du = 1 - tanh(u)^2.
        upstream_hidden = (upstream @ w2) * (1.0 - hidden**2)
        grad_w1 = upstream_hidden.T @ observations
        grad_b1 = upstream_hidden.sum(axis=0)
        return np.concatenate([grad_w1.ravel(), grad_b1, grad_w2.ravel(), grad_b2])


def log_probabilities(policy: LinearSoftmaxPolicy | MlpSoftmaxPolicy, params: np.ndarray,
                      observations: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """log pi(actions[t] | observations[t]) for a batch of steps, float64 (T,)."""
    logits = policy.logits(params, observations)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_norm = np.log(np.exp(shifted).sum(axis=-1))
    return shifted[np.arange(len(actions)), actions] - log_norm
