"""The checked exercises of notebooks 32-39 are answerable: for each, a right solution written here
(independently of the library's code: loops and numpy) passes `check` against the notebook's
reference on the notebook's input generator (copied verbatim), and a plausible wrong one fails."""

import numpy as np
import pytest
import torch

from agentrl_lib.exercises import ExerciseError, check


def _answerable(right, wrong, reference, make_inputs, **kw):
    assert check(right, reference, make_inputs, **kw) is True
    with pytest.raises(ExerciseError):
        check(wrong, reference, make_inputs, **kw)


# 32_archer
def _nb32_v_target_inputs(rng):
    """(q_t, probs): B in 1..4, E in 1..3 members, A in 2..5 actions (+1 malformed column)."""
    B, E, A = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(2, 6))
    return torch.tensor(rng.normal(size=(B, E, A + 1))), torch.tensor(rng.dirichlet(np.ones(A), size=B))


def _nb32_advantage_inputs(rng):
    """(q, v, a): as above, with V (B, E) and the taken action a (B,), malformed (= A) included."""
    B, E, A = int(rng.integers(1, 5)), int(rng.integers(1, 4)), int(rng.integers(2, 6))
    return (torch.tensor(rng.normal(size=(B, E, A + 1))), torch.tensor(rng.normal(size=(B, E))),
            torch.tensor(rng.integers(0, A + 1, size=B)))


def test_nb32_v_targets_and_pessimistic_advantage():
    from agentrl_lib.algorithms import archer

    def right_v(q_t, probs, greedy=False):
        q, p = np.asarray(q_t), np.asarray(probs)
        B, E, _ = q.shape
        A = p.shape[1]
        out = np.zeros((B, E))
        for b in range(B):
            for e in range(E):
                out[b, e] = q[b, e, :A].max() if greedy else sum(p[b, a] * q[b, e, a] for a in range(A))
        return out

    def right_adv(q, v, a, agg=min):
        q, v, a = np.asarray(q), np.asarray(v), np.asarray(a)
        return np.array([agg(q[b, :, a[b]]) - agg(v[b]) for b in range(len(a))])

    _answerable(right_v, lambda q, p: right_v(q, p, greedy=True),  # the Q-learning max target
                archer.v_targets, _nb32_v_target_inputs)
    _answerable(right_adv, lambda q, v, a: right_adv(q, v, a, agg=np.mean),  # ensemble mean, not min
                archer.advantages_from_critic, _nb32_advantage_inputs)


# 33_spa_rl
def _nb33_spa_inputs(rng):
    """(contributions, valid, alpha, beta, gamma): 1..4 episodes of 1..6 turns, ~80% executable."""
    T = rng.integers(1, 7, size=int(rng.integers(1, 5)))
    return ([rng.normal(size=t) for t in T], [(rng.random(t) < 0.8).astype(float) for t in T],
            float(rng.uniform(0.0, 2.0)), float(rng.uniform(0.0, 1.0)), float(rng.uniform(0.5, 1.0)))


def _nb33_spa_reference(contributions, valid, alpha, beta, gamma):
    from types import SimpleNamespace

    from agentrl_lib.algorithms import spa

    episodes = [SimpleNamespace(valid=g) for g in valid]
    return spa.spa_advantages(episodes, lambda eps: contributions,
                              spa.SPAConfig(alpha=alpha, beta=beta, gamma=gamma))


def test_nb33_spa_advantages():
    def right(contributions, valid, alpha, beta, gamma, per_episode=False):
        togo = []
        for c, g in zip(contributions, valid):
            r = [alpha * ck + beta * gk for ck, gk in zip(c, g)]
            togo.append(np.array([sum(gamma ** (k - t) * r[k] for k in range(t, len(r)))
                                  for t in range(len(r))]))
        groups = [[a] for a in togo] if per_episode else [togo]
        out = []
        for grp in groups:
            flat = np.concatenate(grp)
            if len(flat) > 1:
                flat = (flat - flat.mean()) / (flat.std() + 1e-8)
            out += np.split(flat, np.cumsum([len(a) for a in grp])[:-1])
        return out

    _answerable(right, lambda *x: right(*x, per_episode=True),  # whitens each episode on its own
                _nb33_spa_reference, _nb33_spa_inputs)


# 34_credit_arena
def _nb34_pg_inputs(rng):
    """(rows, actions, adv, probs, num_rows, num_episodes): 1..10 turns over 1..4 rows, 2..4 actions."""
    R, A, N = int(rng.integers(1, 5)), int(rng.integers(2, 5)), int(rng.integers(1, 11))
    return (rng.integers(0, R, size=N), rng.integers(0, A, size=N), rng.normal(size=N),
            rng.dirichlet(np.ones(A), size=R), R, int(rng.integers(1, 5)))


def _nb34_affine_inputs(rng):
    """(est, exact), each (N,) with N in 1..10; one time in five the estimates are all equal."""
    N = int(rng.integers(1, 11))
    exact = rng.normal(size=N)
    est = np.full(N, rng.normal()) if rng.random() < 0.2 else 2 * exact + rng.normal(size=N)
    return est, exact


def test_nb34_pg_direction_and_affine_mse():
    from agentrl_lib.analysis import arena

    def right_pg(rows, actions, adv, probs, num_rows, num_episodes, baseline=True):
        g = np.zeros((num_rows, probs.shape[1]))
        for s, a, A in zip(rows, actions, adv):
            grad = -probs[s] if baseline else np.zeros(probs.shape[1])
            grad = grad.copy()
            grad[a] += 1.0
            g[s] += A * grad
        return g / num_episodes

    def right_affine(est, exact, fit=True):
        if not fit:  # the raw error, no rescaling
            return float(np.mean((est - exact) ** 2))
        X = np.stack([est, np.ones(len(est))], 1)
        coef = np.linalg.lstsq(X, exact, rcond=None)[0]
        return float(np.mean((X @ coef - exact) ** 2))

    _answerable(right_pg, lambda *x: right_pg(*x, baseline=False),  # d log pi = one-hot only
                arena.pg_direction, _nb34_pg_inputs)
    _answerable(right_affine, lambda e, x: right_affine(e, x, fit=False), arena.affine_mse,
                _nb34_affine_inputs)


# 35_salt
def _nb35_salt_inputs(rng):
    """(states, actions, outcomes): 2..6 episodes of 1..4 turns from state 0, 3 states, 2 actions."""
    G = int(rng.integers(2, 7))
    T = rng.integers(1, 5, size=G)
    states = [[0] + [int(x) for x in rng.integers(0, 3, size=t - 1)] for t in T]
    actions = [[int(x) for x in rng.integers(0, 2, size=t)] for t in T]
    return states, actions, [float(x) for x in rng.integers(0, 2, size=G)]


def _nb35_salt_reference(states, actions, outcomes):
    from agentrl_lib.algorithms import salt
    from agentrl_lib.rollout import Episode

    episodes = [Episode.of(s, [0.0] * (len(s) - 1) + [r], action_ids=a)
                for s, a, r in zip(states, actions, outcomes)]
    return salt.salt_advantages(episodes, gamma=1.0, norm_adv=False)


def test_nb35_salt_edge_mean():
    def right(states, actions, outcomes, edge=lambda s, a: (s, a)):
        a_traj = np.array(outcomes) - np.mean(outcomes)
        traversals = {}
        for i, (ss, aa) in enumerate(zip(states, actions)):
            for s, a in zip(ss, aa):
                traversals.setdefault(edge(s, a), []).append(a_traj[i])
        return [np.array([np.mean(traversals[edge(s, a)]) for s, a in zip(ss, aa)])
                for ss, aa in zip(states, actions)]

    _answerable(right, lambda *x: right(*x, edge=lambda s, a: s),  # merges on the node, not the edge
                _nb35_salt_reference, _nb35_salt_inputs)


# 36_hgpo
def _nb36_level_inputs(rng):
    """(states, actions, rewards, k, gamma): 2..5 episodes of 1..4 turns from state 0, 2 states,
    2 actions, rewards in {0, 1}; k in 0, 1, 2 or None."""
    T = rng.integers(1, 5, size=int(rng.integers(2, 6)))
    states = [[0] + [int(x) for x in rng.integers(0, 2, size=t - 1)] for t in T]
    actions = [[int(x) for x in rng.integers(0, 2, size=t)] for t in T]
    rewards = [[float(x) for x in rng.integers(0, 2, size=t)] for t in T]
    return states, actions, rewards, [0, 1, 2, None][int(rng.integers(4))], float(rng.uniform(0.5, 1.0))


def _nb36_level_reference(states, actions, rewards, k, gamma):
    from agentrl_lib.algorithms import hgpo
    from agentrl_lib.rollout import Episode

    episodes = [Episode.of(s, r, action_ids=a) for s, a, r in zip(states, actions, rewards)]
    return hgpo.level_advantages(episodes, k, gamma)


def _nb36_weight_inputs(rng):
    """(sizes, weighting, alpha): non-increasing group sizes in 1..6 over 1..4 levels."""
    from agentrl_lib.algorithms import hgpo

    sizes = np.sort(rng.integers(1, 7, size=int(rng.integers(1, 5))))[::-1].copy()
    return sizes, str(rng.choice(hgpo.WEIGHTINGS)), float(rng.uniform(0.0, 3.0))


def test_nb36_level_advantages_and_weights():
    from agentrl_lib.algorithms import hgpo

    def right_levels(states, actions, rewards, k, gamma, ddof=1):
        groups = {}
        for i, (ss, aa, rr) in enumerate(zip(states, actions, rewards)):
            for t in range(len(ss)):
                start = 0 if k is None else max(0, t - k)
                ctx = tuple(x for j in range(start, t) for x in (ss[j], aa[j])) + (ss[t],)
                g = sum(gamma ** (j - t) * rr[j] for j in range(t, len(rr)))
                groups.setdefault(ctx, []).append((i, t, g))
        out = [np.zeros(len(ss)) for ss in states]
        for members in groups.values():
            g = np.array([m[2] for m in members])
            if len(g) > 1 and g.max() > g.min():
                for (i, t, _), z in zip(members, (g - g.mean()) / (g.std(ddof=ddof) + 1e-4)):
                    out[i][t] = z
        return out

    def right_weights(sizes, weighting, alpha, keep_singletons=False):
        K1 = len(sizes)
        ok = [s >= 2 or keep_singletons for s in sizes]
        w = np.zeros(K1)
        if not any(ok):
            return w
        if weighting == "deepest":
            w[max(k for k in range(K1) if ok[k])] = 1.0
            return w
        for k in range(K1):
            if ok[k]:
                w[k] = (k + 1.0) ** (alpha if weighting == "power" else 0.0)
        return w / w.sum()

    _answerable(right_levels, lambda *x: right_levels(*x, ddof=0),  # the population std
                _nb36_level_reference, _nb36_level_inputs)
    _answerable(right_weights, lambda *x: right_weights(*x, keep_singletons=True),  # weights singletons
                hgpo.hierarchy_weights, _nb36_weight_inputs)
