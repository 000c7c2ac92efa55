"""The checked exercises of notebooks 40-53 (part D of issue 16) are answerable: for each, a right
solution written here (loops / numpy, independently of the library's code) passes `check` against
the notebook's reference on the notebook's input generator (copied verbatim), and a plausible wrong
one raises ExerciseError."""

import numpy as np
import pytest
import torch  # noqa: F401  (some generators build tensors)

from agentrl_lib.exercises import ExerciseError, check
from agentrl_lib.rollout import Episode


def _answerable(right, wrong, reference, make_inputs):
    assert check(right, reference, make_inputs) is True
    with pytest.raises(ExerciseError):
        check(wrong, reference, make_inputs)


# 40_hiper
def _nb40_hae_inputs(rng):
    T = int(rng.integers(1, 9))
    seg = np.cumsum(np.r_[0, rng.random(T - 1) < 0.3]).astype(int)  # (T,) non-decreasing from 0
    v_last = 0.0 if rng.random() < 0.5 else float(rng.normal())
    return (rng.normal(size=T), rng.normal(size=T), seg, v_last, float(rng.uniform(0.5, 1.0)),
            float(rng.uniform(0.0, 1.0)))


def _nb40_hae_reference(r, v, seg, v_last, gamma, lam):
    from agentrl_lib.algorithms import hiper

    ep = Episode.of([(t, int(s)) for t, s in enumerate(seg)], list(r), truncated=True)
    return hiper.hiper_advantages([ep], [seg], [v], [v_last], gamma=gamma, lam=lam)[0]


def test_nb40_hae():
    def hae_forward(r, v, seg, v_last, gamma, lam, cut=True):
        """A_t = sum_{j=t}^{e-1} prod(gamma * lam_j) delta_j, e the segment's end (the episode's
        end when not cut); the segment's first turn uses lam = 1."""
        T = len(r)
        v_next = np.append(v[1:], v_last)
        delta = r + gamma * v_next - v
        out = np.zeros(T)
        for t in range(T):
            first = t == 0 or seg[t - 1] != seg[t]
            c = gamma * (1.0 if first and cut else lam)
            end = max(j for j in range(T) if seg[j] == seg[t]) if cut else T - 1
            out[t] = sum(c ** (j - t) * delta[j] for j in range(t, end + 1))
        return out

    _answerable(hae_forward, lambda *a: hae_forward(*a, cut=False),  # flat GAE: no cut
                _nb40_hae_reference, _nb40_hae_inputs)


# 41_agentgym_rl
def _nb41_cap_inputs(rng):
    n = int(rng.integers(1, 5))
    starts = np.r_[0, np.sort(rng.choice(np.arange(1, 40), n - 1, replace=False))].astype(int)
    caps = np.sort(rng.integers(1, 30, size=n))
    k = int(rng.choice(starts)) - int(rng.integers(0, 2)) if rng.random() < 0.6 else int(rng.integers(0, 50))
    return tuple((int(s), int(h)) for s, h in zip(starts, caps)), max(k, 0)


def _nb41_grpo_inputs(rng):
    n = int(rng.integers(1, 11))
    return (rng.integers(0, 2, size=n).astype(float), rng.integers(0, 3, size=n),
            rng.integers(1, 6, size=n))


def _nb41_grpo_reference(rets, group_ids, lengths):
    from agentrl_lib.algorithms import credit

    eps = [Episode.of(["s"] * int(T), [0.0] * (int(T) - 1) + [float(r)], group_id=int(g))
           for r, g, T in zip(rets, group_ids, lengths)]
    return credit.grpo_broadcast(eps)


def test_nb41_cap_and_grpo():
    from agentrl_lib.algorithms.agent_pg import AgentPGConfig

    def cap(schedule, k, strict=False):
        out = None
        for start, h in schedule:  # ascending: the last stage started by k wins
            if start < k or (start == k and not strict):
                out = h
        return out if out is not None else schedule[0][1]

    def grpo(rets, group_ids, lengths, ddof=1):
        out = []
        for j in range(len(rets)):
            mates = [rets[k] for k in range(len(rets)) if group_ids[k] == group_ids[j]]
            if len(mates) < 2 or min(mates) == max(mates):
                a = 0.0
            else:
                a = (rets[j] - np.mean(mates)) / (np.std(mates, ddof=ddof) + 1e-4)
            out.append(np.full(int(lengths[j]), a))
        return out

    _answerable(cap, lambda s, k: cap(s, k, strict=True),  # a stage starts one iteration late
                lambda s, k: AgentPGConfig(horizon_schedule=s).max_turns_at(k), _nb41_cap_inputs)
    _answerable(grpo, lambda *a: grpo(*a, ddof=0),  # the population std
                _nb41_grpo_reference, _nb41_grpo_inputs)


# 42_epo_entropy
def _nb42_epo_inputs(rng):
    n, K = int(rng.integers(1, 13)), int(rng.integers(1, 30))
    h_bar = float(rng.uniform(0.3, 1.5))
    return (torch.tensor(h_bar * rng.uniform(0.1, 2.2, size=n)), h_bar, int(rng.integers(0, K)), K,
            float(rng.uniform(0.0, 0.5)), float(rng.uniform(0.0, 2.0)), float(rng.uniform(0.3, 1.0)),
            float(rng.uniform(1.0, 1.8)))


def _nb42_epo_reference(entropies, h_bar, it, num_iters, c, beta, kappa_lo, kappa_hi):
    from agentrl_lib.algorithms import epo

    cfg = epo.EPOConfig(entropy_coef=c, beta=beta, kappa_lo=kappa_lo, kappa_hi=kappa_hi,
                        num_iters=num_iters)
    return epo.epo_loss(entropies, h_bar, it, cfg)[0]


def test_nb42_epo_loss():
    def epo_loss(h, h_bar, it, K, c, beta, lo, hi, phase=True):
        h = np.asarray(h, dtype=float)
        w = 1.0 - it / max(K - 1, 1) if phase else 1.0
        pen = np.mean([max(lo * h_bar - x, 0.0) + max(x - hi * h_bar, 0.0) for x in h])
        return -c * w * h.mean() + beta * pen

    _answerable(epo_loss, lambda *a: epo_loss(*a, phase=False),  # forgets the phase weight
                _nb42_epo_reference, _nb42_epo_inputs)


# 50_searchgym
def _nb50_linear_inputs(rng):
    n_iters = int(rng.integers(1, 40))
    return int(rng.integers(0, n_iters)), n_iters, int(rng.integers(1, 6)), float(rng.uniform(0.1, 1.0))


def _nb50_collapse_inputs(rng):
    walk = rng.uniform(0, 1) + np.cumsum(rng.normal(0, 0.2, size=int(rng.integers(0, 16))))  # (E,)
    return np.clip(walk, 0, 1), float(rng.uniform(0.05, 0.4))


def test_nb50_linear_curriculum_and_collapses():
    from agentrl_lib.algorithms import curriculum

    def linear(it, n_iters, K, frac, ramp=True):
        f = min(1.0, it / (frac * n_iters if ramp else n_iters))
        return np.array([(1 - f) * (j == 0) + f / K for j in range(K)])

    def collapses(values, drop, running_peak=True):
        count, peak, prev = 0, -np.inf, None
        for x in values:
            peak = max(peak, x)
            ref = peak if running_peak else (x if prev is None else prev)
            count += x < ref - drop
            prev = x
        return count

    _answerable(linear, lambda *a: linear(*a, ramp=False),  # ramps over the whole run
                lambda it, n, K, frac: curriculum.hop_weights(it, n, K, "linear", frac),
                _nb50_linear_inputs)
    _answerable(collapses, lambda *a: collapses(*a, running_peak=False),  # a fall from the last value
                curriculum.collapse_events, _nb50_collapse_inputs)
