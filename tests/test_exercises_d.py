"""The checked exercises of notebooks 40-53 (part D of issue 16) are answerable: for each, a right
solution written here (loops / numpy, independently of the library's code) passes `check` against
the notebook's reference on the notebook's input generator (copied: the same draws in the same
order), and a plausible wrong one raises ExerciseError."""

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
    k = (int(rng.choice(starts)) - int(rng.integers(0, 2)) if rng.random() < 0.6
         else int(rng.integers(0, 50)))
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
            float(rng.uniform(0.0, 0.5)), float(rng.uniform(0.0, 2.0)),
            float(rng.uniform(0.3, 1.0)), float(rng.uniform(1.0, 1.8)))


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
    return (int(rng.integers(0, n_iters)), n_iters, int(rng.integers(1, 6)),
            float(rng.uniform(0.1, 1.0)))


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
    # wrong: a fall from the last value, not from the running peak
    _answerable(collapses, lambda *a: collapses(*a, running_peak=False),
                curriculum.collapse_events, _nb50_collapse_inputs)


# 51_reseek
def _nb51_flag_inputs(rng):
    T = int(rng.integers(1, 7))
    judged = rng.random(T) < 0.35
    verdicts = [str(v) for v in rng.choice(["useful", "useless"], size=T)]
    truths = [str(v) for v in rng.choice(["useful", "useless"], size=T)]
    env_r = np.where(np.arange(T) == T - 1, rng.integers(0, 2), 0).astype(float)  # the outcome
    return (env_r, rng.integers(0, 2, size=T).astype(bool),
            rng.integers(0, 2, size=T).astype(bool),
            [v if j else None for v, j in zip(verdicts, judged)],
            [v if j else None for v, j in zip(truths, judged)])


def _nb51_process_reference(env_r, fact_true, advanced, judge, truth):
    from agentrl_lib.algorithms import reseek

    infos = [dict(fact_true=bool(c), advanced=bool(u), judge=j, judge_truth=h)
             for c, u, j, h in zip(fact_true, advanced, judge, truth)]
    return reseek.process_rewards([Episode.of(["s"] * len(env_r), list(env_r), infos=infos)])[0]


def _nb51_turn_inputs(rng):
    n = int(rng.integers(1, 9))
    return ([np.round(rng.choice([0.0, 0.1, 0.2, 0.4, 1.0], size=int(rng.integers(1, 6))), 1)
             for _ in range(n)],
            rng.integers(0, 3, size=n))


def _nb51_turn_reference(turn_rewards, group_ids):
    from agentrl_lib.algorithms import reseek

    eps = [Episode.of(["s"] * len(r), [0.0] * len(r), group_id=int(g))
           for r, g in zip(turn_rewards, group_ids)]
    return reseek.reseek_advantages(eps, turn_rewards, mode="turn")


def test_nb51_process_rewards_and_turn_advantages():
    def process(env_r, c, u, judge, truth, penalise_wrong=True):
        out = []
        for t in range(len(env_r)):
            r = env_r[t] + 0.2 * c[t] + 0.2 * u[t]
            if judge[t] is not None:
                r += 0.1 if judge[t] == truth[t] else (-0.1 if penalise_wrong else 0.0)
            out.append(r)
        return np.array(out)

    def turn_adv(turn_rewards, group_ids, to_go=True):
        rtg = []
        for r in turn_rewards:
            r = list(r)
            rtg.append([sum(r[t:]) if to_go else r[t] for t in range(len(r))])
        out = []
        for i, g in enumerate(rtg):
            pool = [x for k, h in enumerate(rtg) if group_ids[k] == group_ids[i] for x in h]
            if len(pool) < 2 or max(pool) - min(pool) < 1e-12:
                out.append(np.zeros(len(g)))
            else:
                out.append((np.array(g) - np.mean(pool)) / (np.std(pool, ddof=1) + 1e-4))
        return out

    # wrong: no penalty for a wrong verdict
    _answerable(process, lambda *a: process(*a, penalise_wrong=False),
                _nb51_process_reference, _nb51_flag_inputs)
    _answerable(turn_adv, lambda *a: turn_adv(*a, to_go=False),  # the turn's own reward, not G_t
                _nb51_turn_reference, _nb51_turn_inputs)


# 52_treeps_rag
def _nb52_tree_inputs(rng):
    n = int(rng.integers(1, 9))
    paths = ["".join(rng.choice(["a", "b"], size=int(rng.integers(1, 4)))) for _ in range(n)]
    return paths, rng.integers(0, 2, size=n).astype(float), rng.integers(0, 2, size=n)


def _nb52_leaf(actions, ret, gid=0):
    rewards = [0.0] * (len(actions) - 1) + [ret]
    return Episode.of(["s"] * len(actions), rewards, gid, actions=list(actions))


def _nb52_process_reference(paths, rets, group_ids):
    from agentrl_lib.algorithms import treeps

    return treeps.process_advantages([_nb52_leaf(p, r, int(g))
                                      for p, r, g in zip(paths, rets, group_ids)])


def test_nb52_process_advantages():
    def process(paths, rets, group_ids, local=True):
        out = []
        for i, p in enumerate(paths):
            mates = [k for k in range(len(paths)) if group_ids[k] == group_ids[i]]
            r = np.array([rets[k] for k in mates])
            if len(r) < 2 or r.min() == r.max():
                out.append(np.zeros(len(p)))
                continue

            def value(prefix):
                return np.mean([rets[k] for k in mates if paths[k].startswith(prefix)])

            base = [value(p[:t]) if local else value("") for t in range(len(p))]
            step = np.array([value(p[:t + 1]) - base[t] for t in range(len(p))])
            out.append(step / (r.std(ddof=1) + 1e-4))
        return out

    # wrong: V(n_{t+1}) - V(root), the global term alone
    _answerable(process, lambda *a: process(*a, local=False),
                _nb52_process_reference, _nb52_tree_inputs)


# 53_slate
def _nb53_judge_inputs(rng):
    n = int(rng.integers(1, 7))
    q = np.where(rng.random(n) < 0.5, rng.choice([0.0, 0.5, 1.0], size=n),
                 rng.uniform(0, 1, size=n))
    sigma = 0.0 if rng.random() < 0.2 else float(rng.uniform(0.05, 0.6))
    return q, float(rng.uniform(0.0, 1.0)), sigma


def test_nb53_expected_step_reward():
    import math

    from agentrl_lib.algorithms import slate
    from agentrl_lib.rewards.judges import NoisyJudge

    def by_integration(q, c, sigma, clip=True):
        """E[clip(X, 0, 1)] = int_0^1 P(X > t) dt (Simpson on a fine grid), X ~ N(mu, sigma^2)."""
        mu = c * np.asarray(q, dtype=float) + (1 - c) / 2
        if not clip:
            return 2 * mu - 1
        if sigma == 0:
            return 2 * np.clip(mu, 0, 1) - 1
        t = np.linspace(0.0, 1.0, 4001)
        w = np.ones_like(t)
        w[1:-1:2], w[2:-1:2] = 4, 2
        out = []
        for m in mu:
            tail = np.array([0.5 * math.erfc((x - m) / (sigma * math.sqrt(2))) for x in t])
            out.append((t[1] - t[0]) / 3 * np.sum(w * tail))
        return 2 * np.array(out) - 1

    _answerable(by_integration, lambda *a: by_integration(*a, clip=False),  # forgets the clip
                lambda q, c, s: slate.expected_step_reward(q, NoisyJudge(compression=c, sigma=s)),
                _nb53_judge_inputs)
