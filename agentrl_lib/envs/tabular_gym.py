"""A ``TabularMDP`` as a gymnasium environment, so gymnasium-based loops (``algorithms/ppo.py``)
train on it and the learned policy can be scored with the exact oracles (``algorithms/dp.py``).

Imported on its own (not by ``agentrl_lib.envs``), so the tabular notebooks that do not use
gymnasium do not import it.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import numpy as np


class TabularGymEnv(gym.Env):
    """A ``TabularMDP`` as a gymnasium env with one-hot observations (S,) float32.

    Each instance steps its own deep copy of the MDP, so a vector env of them shares nothing.
    Episodes end on a terminal state (terminated) or after ``mdp.max_steps`` (truncated).
    """

    metadata = {"render_modes": []}

    def __init__(self, mdp):
        super().__init__()
        self.mdp = copy.deepcopy(mdp)
        S = mdp.num_states
        self.observation_space = gym.spaces.Box(0.0, 1.0, shape=(S,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(mdp.num_actions)
        self._eye = np.eye(S, dtype=np.float32)
        self._seeded = False

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        # the MDP's own generator is seeded from gymnasium's on the first reset and on every
        # seeded one, so reset(seed=k) repeats and unseeded copies do not move in lockstep
        mdp_seed = None
        if seed is not None or not self._seeded:
            mdp_seed, self._seeded = int(self.np_random.integers(2**31)), True
        s, info = self.mdp.reset(seed=mdp_seed)
        return self._eye[s], {**info, "state": s}

    def step(self, action):
        s, r, term, trunc, info = self.mdp.step(int(action))
        return self._eye[s], r, term, trunc, {**info, "state": s}
