"""The checked exercises of notebooks 11, 13, 14, 15, 20, 21, 22, 23 are answerable: for each, a
right solution written here (loops / numpy, independently of the library's code) passes `check`
against the notebook's reference on the notebook's input generator (copied verbatim), and a
plausible wrong one raises ExerciseError."""

import numpy as np
import pytest
import torch

from agentrl_lib import core
from agentrl_lib.exercises import ExerciseError, check


def _answerable(right, wrong, reference, make_inputs, **kw):
    assert check(right, reference, make_inputs, **kw) is True
    with pytest.raises(ExerciseError):
        check(wrong, reference, make_inputs, **kw)


# 11_grpo_vs_trl
def _nb11_grpo_loss_inputs(rng):
    G, T = int(rng.integers(2, 7)), int(rng.integers(1, 7))
    old = torch.tensor(-rng.uniform(0.1, 3.0, size=(G, T)))
    lengths = rng.integers(1, T + 1, size=G)
    mask = torch.tensor((np.arange(T)[None] < lengths[:, None]).astype(float))
    return (old + torch.tensor(rng.normal(scale=0.3, size=(G, T))), old,
            old + torch.tensor(rng.normal(scale=0.3, size=(G, T))),
            torch.tensor(rng.integers(0, 2, size=G).astype(float)), mask)


def test_nb11_grpo_loss():
    from agentrl_lib.algorithms import grpo
    from agentrl_lib.algorithms.grpo import GRPOConfig

    def grpo_loss(lp, old, ref, r, mask, per_sequence=True):
        lp, old, ref, r, mask = (np.asarray(x, dtype=float) for x in (lp, old, ref, r, mask))
        G, T = lp.shape
        mu = r.mean()
        sd = np.sqrt(((r - mu) ** 2).sum() / (G - 1))
        adv = np.zeros(G) if r.max() == r.min() else (r - mu) / (sd + 1e-4)
        rows, total, n = [], 0.0, 0.0
        for i in range(G):
            s = 0.0
            for t in range(T):
                if not mask[i, t]:
                    continue
                rho = np.exp(lp[i, t] - old[i, t])
                surr = min(rho * adv[i], min(max(rho, 0.8), 1.2) * adv[i])
                log_r = ref[i, t] - lp[i, t]
                s += -surr + 0.04 * (np.exp(log_r) - 1 - log_r)
            rows.append(s / mask[i].sum())
            total, n = total + s, n + mask[i].sum()
        return sum(rows) / G if per_sequence else total / n

    _answerable(grpo_loss, lambda *x: grpo_loss(*x, per_sequence=False),  # token_mean, not GRPO's
                lambda lp, old, ref, r, m: grpo.policy_loss(
                    lp, old, core.grpo_advantages(r), m, GRPOConfig(beta=0.04), ref)[0],
                _nb11_grpo_loss_inputs)


# 13_ppo_llm
def _nb13_token_adv_inputs(rng):
    B, T = int(rng.integers(1, 4)), int(rng.integers(1, 8))
    lengths = rng.integers(1, T + 1, size=B)
    mask = torch.tensor((np.arange(T)[None] < lengths[:, None]).astype(float))
    scores = torch.tensor(rng.integers(0, 2, size=B).astype(float))
    return scores, torch.tensor(rng.normal(size=(B, T))), mask, float(rng.uniform(0.0, 1.0))


def test_nb13_token_advantages():
    from agentrl_lib.algorithms import ppo_lm

    def token_adv(scores, values, mask, lam, reward_at_end_of_window=False):
        s, v, m = (np.asarray(x, dtype=float) for x in (scores, values, mask))
        B, T = v.shape
        adv, ret = np.zeros((B, T)), np.zeros((B, T))
        for b in range(B):
            n = int(m[b].sum())
            r = np.zeros(T)
            r[T - 1 if reward_at_end_of_window else n - 1] = s[b]
            a = 0.0
            for t in reversed(range(n)):
                v_next = v[b, t + 1] if t + 1 < n else 0.0
                a = r[t] + v_next - v[b, t] + lam * a
                adv[b, t], ret[b, t] = a, a + v[b, t]
        return adv, ret

    # the wrong one ignores the mask
    _answerable(token_adv, lambda *x: token_adv(*x, reward_at_end_of_window=True),
                lambda s, v, m, lam: ppo_lm.token_gae(ppo_lm.token_rewards(s, m), v, m, 1.0, lam),
                _nb13_token_adv_inputs)


# 14_v05
def _nb14_fused_inputs(rng):
    B, N = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    return (rng.integers(0, 2, size=(B, N)).astype(float), rng.uniform(0.02, 0.98, size=B),
            float(rng.uniform(0.001, 0.1)))


def test_nb14_fused_baseline():
    from agentrl_lib.algorithms import v05

    def fused(r, prior, tau2, swapped=False):
        B, N = r.shape
        out = np.zeros((B, N))
        for i in range(B):
            v, m = prior[i], sum(r[i]) / N
            sigma2 = v * (1 - v)
            w = sigma2 / (sigma2 + N * tau2)
            if swapped:  # the weight on the wrong term: the prior gains weight as N grows
                w = 1 - w
            out[i, :] = w * v + (1 - w) * m
        return out

    _answerable(fused, lambda *x: fused(*x, swapped=True),
                lambda r, v, tau2: v05.fused_baseline(r, prior=v, prior_var=tau2)[0],
                _nb14_fused_inputs)


# 15_pope
def _nb15_prefix_inputs(rng):
    num_iters = int(rng.integers(1, 40))
    start = 1.0 if rng.random() < 0.5 else float(rng.uniform(0, 1))  # 1.0: the default
    return (int(rng.integers(0, num_iters)), num_iters, start, float(rng.uniform(0, 1)),
            float(rng.uniform(0.1, 1.0)), int(rng.integers(1, 9)))


def test_nb15_prefix_len():
    import math

    from agentrl_lib.algorithms import pope
    from agentrl_lib.algorithms.pope import POPEConfig

    def prefix(it, num_iters, start, end, anneal_frac, n, anneal=True):
        last = anneal_frac * num_iters if anneal else num_iters
        frac = end if it >= last else start + (end - start) * it / last
        return min(math.floor(frac * n + 1e-9), n - 1)

    _answerable(prefix, lambda *x: prefix(*x, anneal=False),  # anneals over all of training
                lambda it, N, a, b, f, n: pope.prefix_len(pope.prefix_fraction(
                    it, N, POPEConfig(prefix_start=a, prefix_end=b, anneal_frac=f)), n),
                _nb15_prefix_inputs)


# 20_reward_models_dpo
def _nb20_dpo_inputs(rng):
    B = int(rng.integers(1, 9))
    ref = torch.tensor(-rng.uniform(0.5, 20.0, size=(2, B)))
    moved = ref + torch.tensor(rng.normal(scale=2.0, size=(2, B)))
    return moved[0], moved[1], ref[0], ref[1], float(rng.uniform(0.02, 1.0))


def _nb20_kl_optimal_inputs(rng):
    K = int(rng.integers(2, 9))
    return rng.dirichlet(np.ones(K)), rng.normal(scale=3.0, size=K), float(rng.uniform(0.01, 2.0))


def test_nb20_dpo_loss_and_kl_optimum():
    from agentrl_lib.algorithms import dpo

    def right_dpo(c, r, rc, rr, beta, with_ref=True):
        c, r, rc, rr = (np.asarray(x, dtype=float) for x in (c, r, rc, rr))
        h = (c - rc) - (r - rr) if with_ref else c - r
        z = beta * h
        return np.logaddexp(0.0, -z)  # -log sigma(z)

    def right_optimum(ref, rew, beta, temper=True):
        logits = [np.log(p) + (x / beta if temper else x) for p, x in zip(ref, rew)]
        top = max(logits)
        w = [np.exp(v - top) for v in logits]
        return np.array(w) / sum(w)

    _answerable(right_dpo, lambda *x: right_dpo(*x, with_ref=False),  # forgets the reference
                lambda c, r, rc, rr, beta: dpo.dpo_loss(c, r, rc, rr, beta=beta)[0],
                _nb20_dpo_inputs)
    # the wrong one weighs by e^r instead of e^{r/beta}
    _answerable(right_optimum, lambda *x: right_optimum(*x, temper=False),
                dpo.kl_optimal_policy, _nb20_kl_optimal_inputs)


# 21_starc
def _nb21_reward_inputs(rng):
    S, A = int(rng.integers(2, 6)), int(rng.integers(1, 4))
    return torch.tensor(rng.normal(size=(S, A, S))), float(rng.uniform(0.5, 0.99))


def _nb21_starc_inputs(rng):
    S, A = int(rng.integers(2, 6)), int(rng.integers(1, 4))
    P = torch.tensor(rng.dirichlet(np.ones(S), size=(S, A)))  # (S, A, S)
    return (torch.tensor(rng.normal(size=(S, A, S))), torch.tensor(rng.normal(size=(S, A, S))), P,
            float(rng.uniform(0.5, 0.99)))


def test_nb21_epic_and_starc():
    from agentrl_lib.rewards import distances

    def epic(R, gamma, constant=True):
        R = np.asarray(R)
        S, A, _ = R.shape
        m = [R[x].mean() for x in range(S)]
        shift = gamma * np.mean(m) if constant else 0.0
        out = np.zeros_like(R)
        for s in range(S):
            for a in range(A):
                for t in range(S):
                    out[s, a, t] = R[s, a, t] + gamma * m[t] - m[s] - shift
        return out

    def advantage(R, P, gamma):
        R, P = np.asarray(R), np.asarray(P)
        S, A, _ = R.shape
        r = (P * R).sum(-1)  # (S, A)
        P_pi = P.mean(1)  # (S, S) under the uniform policy
        V = np.linalg.solve(np.eye(S) - gamma * P_pi, r.mean(1))
        Q = r + gamma * P @ V
        return np.repeat((Q - V[:, None])[:, :, None], S, axis=2)

    def starc(R1, R2, P, gamma, canonical=True):
        c1, c2 = ((advantage(R, P, gamma) if canonical else np.asarray(R)) for R in (R1, R2))
        s1, s2 = (c / np.linalg.norm(c) if np.linalg.norm(c) > 1e-12 else 0 * c for c in (c1, c2))
        return 0.5 * np.linalg.norm(s1 - s2)

    _answerable(epic, lambda *x: epic(*x, constant=False), distances.epic_canonicalize,
                _nb21_reward_inputs)
    _answerable(starc, lambda *x: starc(*x, canonical=False),  # raw rewards, no levelling
                lambda R1, R2, P, gamma: distances.starc_distance(R1, R2, gamma, P)[0],
                _nb21_starc_inputs)


# 22_barfi
def _nb22_pbrs_inputs(rng):
    S, A = int(rng.integers(2, 7)), int(rng.integers(1, 5))
    return (torch.tensor(rng.normal(size=(S, A))), torch.tensor(rng.normal(size=S)),
            float(rng.uniform(0.5, 0.99)), torch.tensor(rng.dirichlet(np.ones(S), size=(S, A))),
            torch.tensor(rng.random(S) < 0.3))


def test_nb22_pbrs():
    from agentrl_lib.rewards import shaping

    def right_pbrs(R, phi, gamma, P, terminal, zero_at_terminal=True):
        R, phi, P, term = (np.asarray(x) for x in (R, phi, P, terminal))
        Phi = np.where(term, 0.0, phi) if zero_at_terminal else phi
        S, A = R.shape
        out = np.zeros((S, A))
        for s in range(S):
            for a in range(A):
                out[s, a] = R[s, a] + gamma * sum(P[s, a, t] * Phi[t] for t in range(S)) - Phi[s]
        return out

    # the wrong one keeps Phi at terminal states
    _answerable(right_pbrs, lambda *x: right_pbrs(*x, zero_at_terminal=False),
                lambda R, phi, gamma, P, term: shaping.pbrs(R, phi, gamma, P=P, terminal=term),
                _nb22_pbrs_inputs)


# 23_prm_clip_delta
def _nb23_process_inputs(rng):
    B, T = int(rng.integers(1, 5)), int(rng.integers(1, 7))
    lengths = rng.integers(1, T + 1, size=B)
    mask = torch.tensor(np.arange(T)[None] < lengths[:, None])
    success = torch.tensor(rng.integers(0, 2, size=B).astype(float))
    return (torch.tensor(rng.uniform(0, 1, size=(B, T))), mask, success,
            str(rng.choice(["clip", "delta"])), float(rng.uniform(0.2, 0.8)))


def test_nb23_clip_and_delta():
    from agentrl_lib.rewards import process as pr

    def right(scores, step_mask, success, kind, eta, peek_past_end=False):
        s, m, ok = (np.asarray(x, dtype=float) for x in (scores, step_mask, success))
        B, T = s.shape
        out = np.zeros((B, T + 1))
        for b in range(B):
            K = int(m[b].sum())
            for k in range(K):
                if kind == "clip":
                    out[b, k] = min(s[b, k] - eta, 0.0)
                else:
                    nxt = s[b, k + 1] if k + 1 < (T if peek_past_end else K) else 0.0
                    out[b, k] = s[b, k] - nxt
            out[b, K] += ok[b]
        return out

    _answerable(right, lambda *x: right(*x, peek_past_end=True),  # Delta reads the padding's score
                lambda s, m, ok, kind, eta: pr.process_rewards(s, m, ok, kind, eta=eta)[0],
                _nb23_process_inputs)
