"""The checked exercises of notebooks 54, 55, 60, 70, 71 and 72 are answerable: for each, a right
solution written here (loops / numpy, independently of the library's code) passes `check` against
the notebook's reference on the notebook's input generator (copied verbatim), and a plausible wrong
one raises ExerciseError."""

import dataclasses
import math

import numpy as np
import pytest
import torch

from agentrl_lib.exercises import ExerciseError, check


def _answerable(right, wrong, reference, make_inputs):
    assert check(right, reference, make_inputs) is True
    with pytest.raises(ExerciseError):
        check(wrong, reference, make_inputs)


def _normalise(x, ddof=1, eps=1e-4):
    """(x - mean) / (std + eps), 0 for one member or all-equal values (the library's convention)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2 or np.all(x == x[0]):
        return np.zeros(len(x))
    return (x - x.mean()) / (x.std(ddof=ddof) + eps)


def _pooled(values, keys):
    """Normalise each value within the pool of samples sharing its key."""
    out = np.zeros(len(values))
    for key in set(keys):
        idx = [i for i, k in enumerate(keys) if k == key]
        out[idx] = _normalise(np.asarray(values, dtype=float)[idx])
    return out


# 54_stratified_grpo
def _nb54_san_inputs(rng):
    n = int(rng.integers(4, 13))
    return (rng.integers(0, 2, size=n).astype(float), rng.integers(0, 3, size=n),
            rng.integers(0, 3, size=n), float(rng.uniform(0.0, 1.0)))


def test_nb54_san_advantages():
    from agentrl_lib.algorithms import stratified as st

    def right(R, g, k, alpha, within_group=True):
        cells = [(gi, ki) if within_group else ki for gi, ki in zip(g.tolist(), k.tolist())]
        return alpha * _pooled(R, cells) + (1 - alpha) * _pooled(R, g.tolist())

    _answerable(right, lambda *x: right(*x, within_group=False),  # strata pooled across groups
                lambda R, g, k, a: st.san_advantages(R, g, k, alpha=a)[0], _nb54_san_inputs)


# 55_arpo
def _nb55_tree_inputs(rng):
    ids, node_ids = {}, []
    for _ in range(int(rng.integers(2, 7))):
        path = tuple(int(c) for c in rng.integers(0, 2, size=int(rng.integers(1, 5))))
        node_ids.append([ids.setdefault(path[:t + 1], len(ids)) for t in range(len(path))])
    return node_ids, rng.normal(size=len(node_ids))


def _nb55_count_inputs(rng):
    h_max = float(rng.uniform(0.5, 2.0))
    return (int(rng.integers(2, 17)), float(rng.uniform(0, h_max)), float(rng.uniform(0, h_max)),
            float(rng.uniform(0.0, 8.0)), h_max)


def test_nb55_hard_attribution_and_global_count():
    from agentrl_lib.algorithms import arpo

    def right_attr(node_ids, leaf_adv, divide=True):
        out = []
        for ids in node_ids:
            steps = []
            for n in ids:
                sharing = [j for j, other in enumerate(node_ids) if n in other]
                mean = sum(leaf_adv[j] for j in sharing) / len(sharing)
                steps.append(mean / len(sharing) if divide else mean)
            out.append(np.array(steps))
        return out

    def right_count(M, h_root, h_tool, kappa, h_max, rounding=round):
        sigma = 1.0 / (1.0 + math.exp(-kappa * (h_root - h_tool) / h_max))
        return int(min(max(rounding(M * sigma), 1), M))

    _answerable(right_attr, lambda *x: right_attr(*x, divide=False),  # each copy gets the mean
                lambda ids, a: arpo.attribute(ids, a, "hard"), _nb55_tree_inputs)
    _answerable(right_count, lambda *x: right_count(*x, rounding=math.floor),  # floors
                arpo.global_count, _nb55_count_inputs)


# 60_dr_mas
def _nb60_normalise_inputs(rng):
    n = int(rng.integers(4, 17))
    agents = rng.integers(0, 2, size=n)
    rewards = np.where(agents == 0, rng.integers(0, 2, size=n), rng.integers(0, 7, size=n) / 2)
    return rewards.astype(float), rng.integers(0, 3, size=n), agents


def _nb60_moment_inputs(rng):
    r_k = rng.normal(loc=rng.uniform(-1, 1), size=int(rng.integers(2, 9)))
    return r_k, np.concatenate([r_k, rng.normal(scale=2.0, size=int(rng.integers(2, 9)))])


def test_nb60_agent_normalise_and_second_moment():
    from agentrl_lib.algorithms import dr_mas

    def right_norm(r, g, k):
        return _pooled(r, list(zip(g.tolist(), k.tolist())))

    def wrong_norm(r, g, k):  # one pool per group: vanilla GRPO over the agents
        return _pooled(r, g.tolist())

    def right_moment(r_k, r_all, ddof=0):
        mu_k, mu = sum(r_k) / len(r_k), sum(r_all) / len(r_all)
        var_k = sum((x - mu_k) ** 2 for x in r_k) / (len(r_k) - ddof)
        var = sum((x - mu) ** 2 for x in r_all) / (len(r_all) - ddof)
        return (var_k + (mu_k - mu) ** 2) / var

    _answerable(right_norm, wrong_norm,
                lambda r, g, k: dr_mas.normalise_rewards(r, g, k, "agent"), _nb60_normalise_inputs)
    _answerable(right_moment, lambda *x: right_moment(*x, ddof=1),  # sample variances
                dr_mas.global_second_moment, _nb60_moment_inputs)


# 70_stop_regressing
def _nb70_loss_inputs(rng):
    from agentrl_lib.algorithms import value_targets as vt

    B, K = int(rng.integers(1, 5)), int(rng.integers(3, 9))
    v_min = float(rng.uniform(-1.0, 0.0))
    v_max = v_min + float(rng.uniform(1.0, 3.0))
    support = vt.uniform_support(v_min, v_max, K)
    width = (v_max - v_min) / (K - 1)
    y = rng.uniform(v_min - 0.5, v_max + 0.5, size=B)
    return (torch.tensor(rng.normal(size=(B, K))), torch.tensor(y),
            str(rng.choice(["two_hot", "hl_gauss"])), support, float(rng.uniform(0.4, 1.5)) * width)


def test_nb70_value_loss():
    from agentrl_lib.algorithms import value_targets as vt

    def right(logits, y, kind, support, sigma, bins=True):
        z = np.asarray(support, dtype=float)
        K, w = len(z), z[1] - z[0]
        total = 0.0
        for lg, yb in zip(np.asarray(logits, dtype=float), np.asarray(y, dtype=float)):
            p = np.zeros(K)
            if kind == "two_hot":
                yc = min(max(yb, z[0]), z[-1])
                i = min(int((yc - z[0]) // w), K - 2)
                frac = (yc - z[i]) / w
                p[i], p[i + 1] = 1 - frac, frac
            else:
                for k in range(K):
                    if bins:  # the mass of N(y, sigma^2) in the bin around z_k
                        lo, hi = (z[k] - w / 2 - yb) / sigma, (z[k] + w / 2 - yb) / sigma
                        p[k] = 0.5 * (math.erf(hi / math.sqrt(2)) - math.erf(lo / math.sqrt(2)))
                    else:  # the density at z_k
                        p[k] = math.exp(-0.5 * ((z[k] - yb) / sigma) ** 2)
                p /= p.sum()
            log_softmax = lg - lg.max() - math.log(np.exp(lg - lg.max()).sum())
            total += -(p * log_softmax).sum()
        return total / len(y)

    _answerable(right, lambda *x: right(*x, bins=False), vt.value_loss, _nb70_loss_inputs)


# 71_bcoder
def _nb71_bellman_inputs(rng):
    B, T = int(rng.integers(1, 4)), int(rng.integers(1, 7))
    mask = (np.arange(T)[None] < rng.integers(0, T + 1, size=(B, 1))).astype(float)
    rewards = rng.integers(0, 2, size=B).astype(float)
    return (torch.tensor(rng.normal(size=(B, T))), torch.tensor(rewards),
            torch.tensor(mask), float(rng.uniform(0.8, 1.0)))


def _nb71_cql_inputs(rng):
    B, T, V = int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(2, 7))
    q_all = torch.tensor(rng.normal(size=(B, T, V)))
    q_data = q_all.gather(-1, torch.tensor(rng.integers(0, V, size=(B, T, 1)))).squeeze(-1)
    mask = (np.arange(T)[None] < rng.integers(0, T + 1, size=(B, 1))).astype(float)
    return q_all, q_data, torch.tensor(mask)


def test_nb71_bellman_targets_and_cql():
    from agentrl_lib.algorithms import bcoder

    def right_targets(next_max_q, rewards, mask, gamma, bootstrap_last=False):
        q, r, m = np.asarray(next_max_q), np.asarray(rewards), np.asarray(mask)
        y = np.zeros_like(q)
        for b in range(q.shape[0]):
            n = int(m[b].sum())
            for t in range(n):
                if t < n - 1:
                    y[b, t] = gamma * q[b, t]
                else:  # the last token: the verdict, nothing after it
                    y[b, t] = r[b] + (gamma * q[b, t] if bootstrap_last else 0.0)
        return y

    def right_cql(q_all, q_data, mask, use_mask=True):
        q, qd, m = np.asarray(q_all), np.asarray(q_data), np.asarray(mask)
        if not use_mask:
            m = np.ones_like(m)
        gaps = [math.log(np.exp(q[b, t]).sum()) - qd[b, t]
                for b in range(m.shape[0]) for t in range(m.shape[1]) if m[b, t]]
        return sum(gaps) / len(gaps) if gaps else 0.0

    # the wrong one bootstraps past the end: r + gamma max Q on the last token
    _answerable(right_targets, lambda *x: right_targets(*x, bootstrap_last=True),
                bcoder.bellman_targets, _nb71_bellman_inputs)
    _answerable(right_cql, lambda *x: right_cql(*x, use_mask=False),  # counts the padding
                lambda q, qd, m: bcoder.cql_penalty(q, qd, m)[0], _nb71_cql_inputs)


# 72_step_q
def _nb72_q_star_inputs(rng):
    from agentrl_lib.envs.tabular import random_mdp

    S, A = int(rng.integers(2, 7)), int(rng.integers(1, 4))
    m = random_mdp(S, A, gamma=float(rng.uniform(0.5, 1.0)), seed=int(rng.integers(1 << 31)))
    m = dataclasses.replace(m, terminal=torch.as_tensor(rng.random(S) < 0.3))
    return m, int(rng.integers(1, 6))


def _nb72_uct_inputs(rng):
    A = int(rng.integers(2, 6))
    n = rng.integers(0, 6, size=A)
    return rng.uniform(0, 1, size=A), n, int(n.sum()), float(rng.uniform(0.1, 2.0))


def test_nb72_q_star_and_uct():
    from agentrl_lib.algorithms import step_q as sq

    def right_q(mdp, H, reverse=False):
        P, R, term = mdp.P.numpy(), mdp.R.numpy(), mdp.terminal.numpy()
        S, A = R.shape
        Q = np.zeros((H, S, A))
        for t in reversed(range(H)):  # H - t turns left
            for s in range(S):
                for a in range(A):
                    if term[s]:
                        continue
                    future = 0.0
                    if t + 1 < H:
                        future = sum(P[s, a, s2] * Q[t + 1, s2].max() for s2 in range(S))
                    Q[t, s, a] = R[s, a] + mdp.gamma * future
        return Q[::-1].copy() if reverse else Q

    def right_uct(q, n, N, c, log_of_parent=True):
        out = np.full(len(q), np.inf)
        for a in range(len(q)):
            if n[a] > 0:
                ln = math.log(max(N, 1)) if log_of_parent else max(N, 1)
                out[a] = q[a] + c * math.sqrt(ln / n[a])
        return out

    _answerable(right_q, lambda m, H: right_q(m, H, reverse=True),  # indexed by turns left
                lambda m, H: sq.finite_horizon_q(m, None, H), _nb72_q_star_inputs)
    _answerable(right_uct, lambda *x: right_uct(*x, log_of_parent=False),  # sqrt(N / n): no log
                sq.uct_scores, _nb72_uct_inputs)
