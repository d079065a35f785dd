"""REINFORCE on a Gymnasium environment as a stochastic objective.

``ReinforceObjective(env_id, policy, episodes=K)(params, seed)`` runs K episodes
of the policy with parameters ``params`` and returns an ``Evaluation``:

- ``loss``: minus the mean undiscounted return of the K episodes (lower is better,
  the convention of every method), and ``episode_returns``: the K returns.
- ``grad``: the REINFORCE estimate of the gradient of the loss,
  ``-(1 / T) * sum_t A_t * grad log pi(a_t | s_t)`` over the T steps of the K
  episodes, where A_t is the discounted return-to-go (gamma = 0.99) standardized
  over those T steps (mean 0, standard deviation 1): the usual variance
  reduction of REINFORCE; it also makes the gradient's scale independent of the
  episode lengths.

Seeds: ``seed`` determines everything. A ``numpy.random.Generator`` seeded with
it draws the K episodes' ``env.reset(seed=...)`` seeds and then the uniform
draws that sample the actions, so the same (params, seed) gives the same
episodes and the same gradient in any process.

The environment is made once per process (``gymnasium.make``, with its
registered time limit) and cached.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from methods import Evaluation
from policies import LinearSoftmaxPolicy, MlpSoftmaxPolicy

_environments: dict[str, Any] = {}


def environment(env_id: str) -> Any:
    """This process's instance of ``env_id`` (made on first use)."""
    if env_id not in _environments:
        import gymnasium

        _environments[env_id] = gymnasium.make(env_id)
    return _environments[env_id]


def discounted_returns_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """G_t = sum_{k >= t} gamma^(k - t) r_k for one episode."""
    out = np.empty(len(rewards))
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


@dataclasses.dataclass(frozen=True)
class ReinforceObjective:
    """K episodes of ``policy`` on ``env_id`` per evaluation; see the module docstring."""

    env_id: str
    policy: LinearSoftmaxPolicy | MlpSoftmaxPolicy
    episodes: int
    gamma: float = 0.99

    def warm_up(self) -> None:
        """Makes the environment (in a worker process, before any timed round)."""
        environment(self.env_id)

    def __call__(self, params: np.ndarray, seed: int) -> Evaluation:
        env = environment(self.env_id)
        rng = np.random.default_rng(seed)
        reset_seeds = rng.integers(0, 2**31 - 1, size=self.episodes)
        prepared = self.policy.prepare(params)
        observations: list[np.ndarray] = []
        actions: list[int] = []
        advantages: list[np.ndarray] = []
        episode_returns = np.empty(self.episodes)
        for k, reset_seed in enumerate(reset_seeds):
            obs, _ = env.reset(seed=int(reset_seed))
            rewards: list[float] = []
            done = False
            while not done:
                action = self.policy.act(prepared, obs, rng.random())
                observations.append(obs)
                actions.append(action)
                obs, reward, terminated, truncated, _ = env.step(action)
                rewards.append(float(reward))
                done = terminated or truncated
            episode_returns[k] = sum(rewards)
            advantages.append(discounted_returns_to_go(np.asarray(rewards), self.gamma))
        weights = np.concatenate(advantages)
        weights = (weights - weights.mean()) / (weights.std() + 1e-8)
        steps = len(weights)
        grad = -self.policy.weighted_log_prob_gradient(
            params, np.asarray(observations, dtype=np.float64), np.asarray(actions), weights
        ) / steps
        return Evaluation(float(-episode_returns.mean()), grad.astype(np.float32), episode_returns)
