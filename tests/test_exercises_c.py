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
    return (torch.tensor(rng.normal(size=(B, E, A + 1))),
            torch.tensor(rng.dirichlet(np.ones(A), size=B)))


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
                out[b, e] = (q[b, e, :A].max() if greedy
                             else sum(p[b, a] * q[b, e, a] for a in range(A)))
        return out

    def right_adv(q, v, a, agg=min):
        q, v, a = np.asarray(q), np.asarray(v), np.asarray(a)
        return np.array([agg(q[b, :, a[b]]) - agg(v[b]) for b in range(len(a))])

    _answerable(right_v, lambda q, p: right_v(q, p, greedy=True),  # the Q-learning max target
                archer.v_targets, _nb32_v_target_inputs)
    _answerable(right_adv, lambda q, v, a: right_adv(q, v, a, agg=np.mean),  # ensemble mean
                archer.advantages_from_critic, _nb32_advantage_inputs)


# 33_spa_rl
def _nb33_spa_inputs(rng):
    """(contributions, valid, alpha, beta, gamma): 1..4 episodes of 1..6 turns, ~80% executable."""
    T = rng.integers(1, 7, size=int(rng.integers(1, 5)))
    return ([rng.normal(size=t) for t in T], [(rng.random(t) < 0.8).astype(float) for t in T],
            float(rng.uniform(0.0, 2.0)), float(rng.uniform(0.0, 1.0)),
            float(rng.uniform(0.5, 1.0)))


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
    """(rows, actions, adv, probs, num_rows, num_episodes): 1..10 turns over 1..4 rows, 2..4
    actions."""
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
    """(states, actions, outcomes): 2..6 episodes of 1..4 turns from state 0, 3 states, 2
    actions."""
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

    _answerable(right, lambda *x: right(*x, edge=lambda s, a: s),  # merges nodes, not edges
                _nb35_salt_reference, _nb35_salt_inputs)


# 36_hgpo
def _nb36_level_inputs(rng):
    """(states, actions, rewards, k, gamma): 2..5 episodes of 1..4 turns from state 0, 2 states,
    2 actions, rewards in {0, 1}; k in 0, 1, 2 or None."""
    T = rng.integers(1, 5, size=int(rng.integers(2, 6)))
    states = [[0] + [int(x) for x in rng.integers(0, 2, size=t - 1)] for t in T]
    actions = [[int(x) for x in rng.integers(0, 2, size=t)] for t in T]
    rewards = [[float(x) for x in rng.integers(0, 2, size=t)] for t in T]
    return (states, actions, rewards, [0, 1, 2, None][int(rng.integers(4))],
            float(rng.uniform(0.5, 1.0)))


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
    _answerable(right_weights, lambda *x: right_weights(*x, keep_singletons=True),  # singletons
                hgpo.hierarchy_weights, _nb36_weight_inputs)


# 37_oprl
def _nb37_dpo_inputs(rng):
    """(logps_n, ref_logps_n, owner_n, num_episodes, chosen, rejected, beta): 2..5 episodes of 1..3
    turns, 1..4 pairs of distinct episodes."""
    T = rng.integers(1, 4, size=int(rng.integers(2, 6)))
    owner = torch.tensor(np.repeat(np.arange(len(T)), T))
    pairs = [rng.choice(len(T), size=2, replace=False) for _ in range(int(rng.integers(1, 5)))]
    return (torch.tensor(-rng.uniform(0.1, 2.0, size=len(owner))),
            torch.tensor(-rng.uniform(0.1, 2.0, size=len(owner))), owner, len(T),
            torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs]),
            float(rng.uniform(0.1, 2.0)))


def _nb37_istar_inputs(rng):
    """(outcomes, step_rewards, alpha): 2..5 episodes of 1..4 turns, outcomes in {0, 1}."""
    T = rng.integers(1, 5, size=int(rng.integers(2, 6)))
    return ([float(x) for x in rng.integers(0, 2, size=len(T))], [rng.normal(size=t) for t in T],
            float(rng.uniform(0.0, 2.0)))


def _nb37_istar_reference(outcomes, step_rewards, alpha):
    from agentrl_lib.algorithms import oprl
    from agentrl_lib.rollout import Episode

    episodes = [Episode.of(["s"] * len(r), [0.0] * (len(r) - 1) + [R])
                for R, r in zip(outcomes, step_rewards)]
    return oprl.oprl_advantages(episodes, step_rewards, alpha)


def test_nb37_trajectory_dpo_and_istar_advantages():
    from agentrl_lib.algorithms import oprl

    def right_dpo(lp, ref, owner, B, chosen, rejected, beta, per_turn_mean=False):
        lp, ref, owner = np.asarray(lp), np.asarray(ref), np.asarray(owner)
        ratio = np.zeros(B)
        for n in range(len(owner)):
            ratio[owner[n]] += lp[n] - ref[n]
        if per_turn_mean:  # averages the log-ratio over the turns instead of summing
            ratio /= np.bincount(owner, minlength=B)
        h = beta * (ratio[np.asarray(chosen)] - ratio[np.asarray(rejected)])
        return float(np.mean(np.log1p(np.exp(-h))))

    def normalise(x):
        x = np.asarray(x, dtype=float)
        if len(x) < 2 or x.max() == x.min():
            return np.zeros(len(x))
        return (x - x.mean()) / (x.std(ddof=1) + 1e-4)

    def right_istar(outcomes, step_rewards, alpha, per_episode_steps=False):
        a_e = normalise(outcomes)
        if per_episode_steps:  # normalises each episode's steps on their own
            a_s = [normalise(r) for r in step_rewards]
        else:
            flat = normalise(np.concatenate(step_rewards))
            a_s = np.split(flat, np.cumsum([len(r) for r in step_rewards])[:-1])
        return [a_e[i] + alpha * a_s[i] for i in range(len(outcomes))]

    _answerable(right_dpo, lambda *x: right_dpo(*x, per_turn_mean=True),
                lambda *a: oprl.trajectory_dpo_loss(*a)[0], _nb37_dpo_inputs)
    _answerable(right_istar, lambda *x: right_istar(*x, per_episode_steps=True),
                _nb37_istar_reference, _nb37_istar_inputs)


# 38_igpo
def _nb38_igpo_inputs(rng):
    """(outcomes, p_gold, gamma): 1..5 episodes of 1..4 turns, outcomes in {0, 1}."""
    T = rng.integers(1, 5, size=int(rng.integers(1, 6)))
    return ([float(x) for x in rng.integers(0, 2, size=len(T))],
            [rng.uniform(size=t + 1) for t in T], float(rng.uniform(0.5, 1.0)))


def _nb38_igpo_reference(outcomes, p_gold, gamma):
    from agentrl_lib.algorithms import igpo
    from agentrl_lib.rollout import Episode

    episodes = [Episode.of(["s"] * (len(p) - 1), [0.0] * (len(p) - 2) + [R])
                for R, p in zip(outcomes, p_gold)]
    return igpo.igpo_advantages(episodes, p_gold, gamma)


def test_nb38_igpo_advantages():
    def right(outcomes, p_gold, gamma, normalise_after_sum=False):
        rewards = []
        for R, p in zip(outcomes, p_gold):
            r = [p[t + 1] - p[t] for t in range(len(p) - 1)]
            r[-1] = R
            rewards.append(np.array(r))

        def to_go(r):
            return np.array([sum(gamma ** (k - t) * r[k] for k in range(t, len(r)))
                             for t in range(len(r))])

        def normalise(parts):
            flat = np.concatenate(parts)
            if len(flat) < 2 or flat.max() == flat.min():
                flat = np.zeros(len(flat))
            else:
                flat = (flat - flat.mean()) / (flat.std(ddof=1) + 1e-4)
            return np.split(flat, np.cumsum([len(x) for x in parts])[:-1])

        if normalise_after_sum:  # sums to go first, then normalises the returns
            return normalise([to_go(r) for r in rewards])
        return [to_go(r) for r in normalise(rewards)]

    _answerable(right, lambda *x: right(*x, normalise_after_sum=True), _nb38_igpo_reference,
                _nb38_igpo_inputs)


# 39_empg
def _nb39_logits_inputs(rng):
    """(logits,): shape (B, A) with B in 1..4 and A in 2..6, scale up to 4."""
    return (rng.normal(scale=rng.uniform(0.1, 4.0),
                       size=(int(rng.integers(1, 5)), int(rng.integers(2, 7)))),)


def _nb39_empg_inputs(rng):
    """(base, entropies, k, k_prime, zeta): 1..4 episodes of 1..4 turns, entropies in [0, log 4]."""
    T = rng.integers(1, 5, size=int(rng.integers(1, 5)))
    return ([rng.normal(size=t) for t in T], [rng.uniform(0.0, np.log(4), size=t) for t in T],
            float(rng.uniform(0.0, 3.0)), float(rng.uniform(0.0, 3.0)),
            float(rng.uniform(0.0, 0.5)))


def _nb39_empg_reference(base, entropies, k, k_prime, zeta):
    from agentrl_lib.algorithms import empg
    from agentrl_lib.rollout import Episode

    episodes = [Episode.of(["s"] * len(a), [0.0] * len(a)) for a in base]
    return empg.empg_advantages(episodes, entropies, k=k, k_prime=k_prime, zeta=zeta,
                                base_advantages=base, final_norm="none")


def test_nb39_score_norm_and_empg_modulation():
    from agentrl_lib.algorithms import empg

    def right_score(logits, squared_probs=True):
        out = np.zeros(logits.shape[:-1])
        for idx in np.ndindex(out.shape):
            z = logits[idx]
            p = np.exp(z - z.max())
            p /= p.sum()
            # E_a ||e_a - p||^2, summed over the actions
            A = len(p)
            out[idx] = sum(p[a] * sum(((b == a) - p[b]) ** 2 for b in range(A)) for a in range(A))
            if not squared_probs:  # the Shannon entropy, the quantity it is often confused with
                out[idx] = -(p * np.log(p)).sum()
        return out

    def right_empg(base, entropies, k, k_prime, zeta, bonus_same_turn=False):
        flat = np.concatenate(entropies)
        lo, hi = flat.min(), flat.max()
        hn = [(h - lo) / (hi - lo + 1e-8) for h in entropies]
        raw = [np.exp(-k * h) for h in hn]
        mean_raw = np.concatenate(raw).mean()
        out = []
        for a, h, r in zip(base, hn, raw):
            f = np.zeros(len(h))
            for t in range(len(h)):
                if bonus_same_turn:
                    f[t] = zeta * np.exp(-k_prime * h[t])
                elif t + 1 < len(h):
                    f[t] = zeta * np.exp(-k_prime * h[t + 1])
            out.append(r / mean_raw * a + f)
        return out

    _answerable(right_score, lambda z: right_score(z, squared_probs=False),
                empg.expected_score_norm_sq, _nb39_logits_inputs)
    _answerable(right_empg, lambda *x: right_empg(*x, bonus_same_turn=True),  # f(H_t), not H_{t+1}
                _nb39_empg_reference, _nb39_empg_inputs)
