"""Simulated judges with controllable noise, and checklist rewards.

A real LLM judge is noisy in known ways; ``NoisyJudge`` simulates three of them, each with its own
knob, so a notebook can ask how a training signal degrades as the judge gets worse:

- **pointwise** scores (``score``): the true quality q in [0, 1] compressed toward the middle and
  blurred, s = c q + (1 - c)/2 + sigma eps, eps ~ N(0, 1), clipped to [0, 1] (``compression`` c,
  ``sigma``);
- **binary verdicts** (``verdict``): each true verdict flipped with probability ``flip``;
- **pairwise** preferences (``compare``): Bradley-Terry, P(a preferred to b) =
  sigmoid((q_a - q_b) / ``temperature``).

``NoisyJudge.at_noise(p)`` ties the knobs to one noise level p so that a holistic score and a
checklist verdict are *equally noisy per judgment*: a verdict v in {0, 1} flipped with probability
p has mean (1 - 2p) v + p and variance p (1 - p); the pointwise score gets the same compression
c = 1 - 2p and the same variance, sigma = sqrt(p (1 - p)).

**Checklist rewards** (CM2, arXiv 2602.12268): each turn's intended behaviour is split into binary
criteria (right tool, right argument names, right values, confirmation asked, ...).
``checklist_reward`` averages a turn's applicable criteria, each verdict optionally passed through
the judge's flips, giving one reward per turn (``judged_checks``: one turn's verdicts as the judge
returns them, for a rollout that the judge steers, ``envs.calc_tool.ChecklistJudgedEnv``);
``holistic_reward`` asks the judge for one scalar score of the whole episode instead (the
baseline judged at the same noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass
class NoisyJudge:
    """A simulated judge. compression: c in [0, 1] (1: no compression); sigma: std of the pointwise
    score's Gaussian noise; flip: probability a binary verdict is flipped; temperature: the
    Bradley-Terry scale of pairwise comparisons (0: deterministic, the better one always wins)."""

    compression: float = 1.0
    sigma: float = 0.0
    flip: float = 0.0
    temperature: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.compression <= 1.0:
            raise ValueError(f"compression must be in [0, 1], got {self.compression}")
        if not 0.0 <= self.flip <= 1.0:
            raise ValueError(f"flip must be in [0, 1], got {self.flip}")
        if self.sigma < 0 or self.temperature < 0:
            raise ValueError("sigma and temperature must be >= 0")

    @classmethod
    def at_noise(cls, p: float, temperature: float | None = None) -> "NoisyJudge":
        """The judge whose pointwise score and binary verdict are equally noisy at level p:
        flip = p, compression = 1 - 2p, sigma = sqrt(p (1 - p)); temperature defaults to p.

        >>> NoisyJudge.at_noise(0.2)
        NoisyJudge(compression=0.6, sigma=0.4, flip=0.2, temperature=0.2)
        """
        if not 0.0 <= p <= 0.5:
            raise ValueError(f"noise level must be in [0, 0.5], got {p}")
        return cls(compression=round(1 - 2 * p, 12), sigma=round(math.sqrt(p * (1 - p)), 12),
                   flip=p, temperature=p if temperature is None else temperature)

    def score(self, quality, rng: np.random.Generator) -> np.ndarray:
        """s = clip(c q + (1 - c)/2 + sigma eps, 0, 1), elementwise over ``quality``."""
        q = np.asarray(quality, dtype=float)
        s = self.compression * q + (1 - self.compression) / 2
        if self.sigma > 0:
            s = s + self.sigma * rng.standard_normal(q.shape)
        return np.clip(s, 0.0, 1.0)

    def verdict(self, truth, rng: np.random.Generator) -> np.ndarray:
        """Each boolean verdict flipped independently with probability ``flip``."""
        t = np.asarray(truth, dtype=bool)
        if self.flip <= 0:
            return t.copy()
        return t ^ (rng.random(t.shape) < self.flip)

    def preference_prob(self, quality_a, quality_b) -> np.ndarray:
        """Bradley-Terry P(a preferred to b) = sigmoid((q_a - q_b) / temperature); a step at 0
        temperature (1/2 on ties)."""
        d = np.asarray(quality_a, dtype=float) - np.asarray(quality_b, dtype=float)
        if self.temperature == 0:
            return np.where(d > 0, 1.0, np.where(d < 0, 0.0, 0.5))
        return 1.0 / (1.0 + np.exp(-d / self.temperature))

    def compare(self, quality_a, quality_b, rng: np.random.Generator) -> np.ndarray:
        """1.0 where a is preferred to b, sampled from ``preference_prob``."""
        p = self.preference_prob(quality_a, quality_b)
        return (rng.random(p.shape) < p).astype(float)


def checklist_reward(checks: list[dict], judge: NoisyJudge | None = None,
                     rng: np.random.Generator | None = None) -> tuple[np.ndarray, dict]:
    """Per-turn checklist rewards r_t = mean_k v_{t,k} over the applicable criteria of turn t
    (``None`` values do not apply), each verdict v flipped by ``judge`` (if given).

    checks: one dict per turn {criterion: bool | None}. Returns ((T,) rewards in [0, 1], metrics:
    ``checklist/true_mean`` the noiseless mean, ``checklist/flipped`` the fraction of verdicts
    flipped, ``checklist/num_criteria``).

    >>> r, m = checklist_reward([{"a": True, "b": False, "c": None}, {"a": True}])
    >>> r.tolist(), m["checklist/num_criteria"]
    ([0.5, 1.0], 3)
    """
    if judge is not None and judge.flip > 0 and rng is None:
        raise ValueError("a noisy judge needs an rng")
    rewards, true_means, flipped, n = [], [], 0, 0
    for turn in checks:
        truth = np.array([bool(v) for v in turn.values() if v is not None], dtype=bool)  # (K,)
        if truth.size == 0:
            rewards.append(0.0)
            true_means.append(0.0)
            continue
        v = truth if judge is None else judge.verdict(truth, rng)
        flipped += int((v != truth).sum())
        n += truth.size
        rewards.append(float(v.mean()))
        true_means.append(float(truth.mean()))
    metrics = {"checklist/true_mean": float(np.mean(true_means)) if true_means else 0.0,
               "checklist/flipped": flipped / n if n else 0.0, "checklist/num_criteria": n}
    return np.array(rewards), metrics


def judged_checks(checks: dict, judge: NoisyJudge, rng: np.random.Generator) -> dict:
    """One turn's checklist as the judge labels it: every applicable verdict passed through
    ``judge.verdict`` (flipped with probability ``judge.flip``), ``None`` (does not apply) kept.
    The same draws as ``checklist_reward`` makes for that turn; ``checklist_reward`` of the
    judged dicts without a judge is then the noisy per-turn reward.

    >>> judged_checks({"a": True, "b": None, "c": False}, NoisyJudge(), None)
    {'a': True, 'b': None, 'c': False}
    """
    keys = [k for k, v in checks.items() if v is not None]
    truth = np.array([bool(checks[k]) for k in keys], dtype=bool)  # (K,)
    v = truth if judge.flip <= 0 or truth.size == 0 else judge.verdict(truth, rng)
    out = dict(checks)
    out.update({k: bool(x) for k, x in zip(keys, v)})
    return out


def episode_quality(checks: list[dict]) -> float:
    """The fraction of applicable criteria met over the whole episode: what a holistic judge
    scores (its true quality q).

    >>> episode_quality([{"a": True, "b": False}, {"a": True, "c": None}])
    0.6666666666666666
    """
    v = [bool(x) for turn in checks for x in turn.values() if x is not None]
    return float(np.mean(v)) if v else 0.0


def holistic_reward(checks: list[dict], judge: NoisyJudge, rng: np.random.Generator,
                    success: bool | None = None, success_weight: float = 0.0) -> tuple[float, dict]:
    """One scalar per episode: the judge's pointwise score of ``episode_quality`` (mixed with the
    outcome as (1 - w) q + w 1[success] when ``success_weight`` w > 0)."""
    q = episode_quality(checks)
    if success is not None and success_weight > 0:
        q = (1 - success_weight) * q + success_weight * float(success)
    s = float(judge.score(q, rng))
    return s, {"holistic/true_quality": q, "holistic/score": s}
