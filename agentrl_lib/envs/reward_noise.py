"""Zero-mean reward noise around any multi-turn environment: the noisy targets of "Stop Regressing"
(Farebrother et al. 2024, arXiv:2403.03950), whose gains are attributed to robustness to noisy
targets.

``RewardNoise(env, std)`` adds eps ~ N(0, std^2) to every reward ``env.step`` returns (the reward is
the second element of the returned tuple, so it wraps the multi-turn protocol's 4-tuple and
``TabularMDP``'s gymnasium 5-tuple alike). The expected reward of every transition is unchanged, so
the environment's exact tabular form, Q* and the optimal policy are those of the clean
environment: a learner's Q error and greedy return can still be scored against the exact optimum.
Every other attribute is the wrapped environment's.
"""

from __future__ import annotations

import numpy as np


class RewardNoise:
    """``env`` with N(0, ``std``^2) added to each reward.

    ## Description
    A wrapper: every attribute but ``reset`` and ``step`` is the wrapped environment's.
    ``reset(seed)`` also reseeds the noise (from ``seed`` and the wrapper's own ``noise_seed``), so
    a seeded episode is reproducible.

    ## Actions
    The wrapped environment's.

    ## Observations
    The wrapped environment's.

    ## Rewards
    The wrapped environment's plus eps ~ N(0, std^2), independent per step (zero mean: every
    transition's expected reward is unchanged).

    ## Episode end
    The wrapped environment's.

    ## Info
    The wrapped environment's.

    ## Arguments
    env: any multi-turn environment (or a ``TabularMDP``: the reward is the second element of either
    step tuple). std >= 0. noise_seed.

    ## Exact form
    The wrapped environment's: its tabular form, Q* and optimal policy are those of the noisy one.
    """

    def __init__(self, env, std: float, noise_seed: int = 0):
        if std < 0:
            raise ValueError(f"std must be >= 0, got {std}")
        self.env, self.std, self.noise_seed = env, float(std), int(noise_seed)
        self._rng = np.random.default_rng(noise_seed)

    def reset(self, seed: int | None = None, **kw):
        if seed is not None:
            self._rng = np.random.default_rng([self.noise_seed, seed])
        return self.env.reset(seed=seed, **kw)

    def step(self, action):
        out = self.env.step(action)
        noise = self._rng.normal(0.0, self.std) if self.std > 0 else 0.0
        return (out[0], out[1] + noise, *out[2:])

    def __getattr__(self, name):  # everything else (actions, tabular_form, state_index, ...)
        return getattr(self.env, name)
