"""The checked exercises of notebooks 24-31 are answerable: for each, a right solution written here
(loops / numpy, not the library's code) passes `check` against the notebook's reference on the
notebook's input generator (copied verbatim), and a plausible wrong one fails."""

import numpy as np
import pytest
import torch

from agentrl_lib.exercises import ExerciseError, check


def _answerable(right, wrong, reference, make_inputs):
    assert check(right, reference, make_inputs) is True
    with pytest.raises(ExerciseError):
        check(wrong, reference, make_inputs)


def _normalise(x, norm_adv=True, eps=1e-4):
    """Group normalisation by hand: 0 for one value or equal values, else centred (/ std ddof 1 + eps)."""
    x = np.asarray(x, dtype=float)
    if len(x) < 2 or np.all(x == x[0]):
        return np.zeros(len(x))
    return (x - x.mean()) / (x.std(ddof=1) + eps) if norm_adv else x - x.mean()


# 24_cooper
def _nb24_bt_inputs(rng):
    """(r_c, r_r), each (B,) with B in 1..16, rewards on scales 1 to 20."""
    B, scale = int(rng.integers(1, 17)), float(rng.choice([1.0, 5.0, 20.0]))
    return torch.tensor(scale * rng.normal(size=B)), torch.tensor(scale * rng.normal(size=B))


def test_nb24_bt_loss():
    from agentrl_lib.rewards import reward_model as rmod

    def right(r_c, r_r):
        d = np.asarray(r_c) - np.asarray(r_r)
        return np.mean(np.logaddexp(0.0, -d)), float(np.mean(d > 0))  # -log sigma(d) = log(1 + e^-d)

    def wrong(r_c, r_r):  # pointwise cross-entropy: chosen labelled 1, rejected 0, not a pair loss
        c, r = np.asarray(r_c), np.asarray(r_r)
        return np.mean(np.logaddexp(0.0, -c)) + np.mean(np.logaddexp(0.0, r)), float(np.mean(c > r))

    _answerable(right, wrong, lambda c, r: (rmod.bt_loss(c, r)[0], rmod.bt_loss(c, r)[1]["accuracy"]),
                _nb24_bt_inputs)


# 25_toolrl
def _nb25_call_inputs(rng):
    """(pred, gold): a training task's gold call and a perturbed prediction, as in 3.2 (another
    tool 40% of the time, a parameter renamed to `q` or a value replaced by "7"; 10% malformed)."""
    from agentrl_lib.envs.calc_tool import TEMPLATES, TOOLS, make_task
    from agentrl_lib.rewards.tool_calls import parse_call

    t = make_task(TEMPLATES["train"][int(rng.integers(5))], rng)
    g_name, g_args = parse_call(t.gold[0])
    name = g_name if rng.random() < 0.6 else str(rng.choice(list(TOOLS)))
    args = {(k if rng.random() < 0.7 else "q"): (v if rng.random() < 0.6 else "7") for k, v in g_args.items()}
    text = f"{name}(" + ", ".join(f'{k}="{v}"' for k, v in args.items()) + ")"
    return (text if rng.random() < 0.9 else text[:-1]), t.gold[0]


def test_nb25_call_match():
    from agentrl_lib.rewards.tool_calls import call_match, parse_call

    def right(pred, gold, jaccard=True):
        g_name, g_args = parse_call(gold)
        g_args = {k: str(v).strip() for k, v in g_args.items()}
        out = {"format": 0.0, "name": 0.0, "param": 0.0, "value": 0, "num_params": len(g_args),
               "exact": False}
        try:
            p_name, p_args = parse_call(pred)
        except ValueError:
            return out
        p_args = {k: str(v).strip() for k, v in p_args.items()}
        common = [k for k in g_args if k in p_args]
        union = set(g_args) | set(p_args)
        if jaccard:
            param = len(common) / len(union) if union else 1.0
        else:  # recall of the gold names
            param = len(common) / len(g_args) if g_args else 1.0
        out.update(format=1.0, name=float(p_name == g_name), param=param,
                   value=sum(p_args[k] == g_args[k] for k in common),
                   exact=p_name == g_name and p_args == g_args)
        return out

    _answerable(right, lambda p, g: right(p, g, jaccard=False), call_match, _nb25_call_inputs)


# 26_cm2
CRITERIA = ("valid", "right_tool", "right_arg_names", "right_values", "confirmation")


def _nb26_checks_inputs(rng):
    """(checks,): 1-5 turns, each criterion True (45%), False (35%) or not applicable (20%)."""
    verdicts = (True, False, None)
    return ([{c: verdicts[int(rng.choice(3, p=[0.45, 0.35, 0.2]))] for c in CRITERIA}
             for _ in range(int(rng.integers(1, 6)))],)


def test_nb26_checklist_and_quality():
    from agentrl_lib.rewards.judges import checklist_reward, episode_quality

    def right_checklist(checks, none_is_false=False):
        out = []
        for turn in checks:
            v = [bool(x) for x in turn.values() if x is not None or none_is_false]
            out.append(sum(v) / len(v) if v else 0.0)
        return np.array(out)

    def right_quality(checks):
        met = n = 0
        for turn in checks:
            for x in turn.values():
                if x is not None:
                    met, n = met + bool(x), n + 1
        return met / n if n else 0.0

    def wrong_quality(checks):  # the mean of the turns' rewards: every turn weighs the same
        return float(np.mean(right_checklist(checks)))

    _answerable(right_checklist, lambda c: right_checklist(c, none_is_false=True),
                lambda c: checklist_reward(c)[0], _nb26_checks_inputs)
    _answerable(right_quality, wrong_quality, episode_quality, _nb26_checks_inputs)


# 27_dpo_rationales
def _nb27_rdpo_inputs(rng):
    """(theta (A,), phi_w (B, A), phi_l (B, A), rationale (B,), beta, gamma): B in 1..8, A in 2..5."""
    B, A = int(rng.integers(1, 9)), int(rng.integers(2, 6))
    return (torch.tensor(rng.normal(size=A)), torch.tensor(rng.normal(size=(B, A))),
            torch.tensor(rng.normal(size=(B, A))), torch.tensor(rng.integers(0, A, size=B)),
            float(rng.uniform(0.05, 2.0)), float(rng.uniform(0.0, 2.0)))


def _nb27_rdpo_reference(theta, phi_w, phi_l, rationale, beta, gamma):
    """The library's two terms; pi_ref uniform and log Z cancel in the log-ratio margin."""
    from agentrl_lib.algorithms import dpo

    zero = torch.zeros(len(phi_w), dtype=theta.dtype)
    pref, _ = dpo.dpo_loss(phi_w @ theta, phi_l @ theta, zero, zero, beta=beta)
    rat, _ = dpo.rationale_nll(beta * theta * (phi_w - phi_l), rationale, gamma)
    return pref + rat


def test_nb27_rdpo_loss():
    def right(theta, phi_w, phi_l, rationale, beta, gamma, beta_in_rationale=True):
        theta, phi_w, phi_l = (np.asarray(x) for x in (theta, phi_w, phi_l))
        out = []
        for b in range(len(phi_w)):
            e = theta * (phi_w[b] - phi_l[b]) * (beta if beta_in_rationale else 1.0)  # (A,)
            margin = beta * float(theta @ (phi_w[b] - phi_l[b]))
            log_p = e[int(rationale[b])] - np.log(np.sum(np.exp(e)))
            out.append(np.log1p(np.exp(-margin)) - gamma * log_p)
        return np.array(out)

    _answerable(right, lambda *a: right(*a, beta_in_rationale=False),  # contributions without beta
                _nb27_rdpo_reference, _nb27_rdpo_inputs)


# 28_spo
def _nb28_wins_inputs(rng):
    """(wins,): N in 2..7 samples, every pair decided once, random 0/1 on the diagonal."""
    N = int(rng.integers(2, 8))
    upper = np.triu(rng.integers(0, 2, size=(N, N)), 1)
    wins = upper + np.tril(1 - upper.T, -1)
    wins[np.diag_indices(N)] = rng.integers(0, 2, size=N)
    return (wins,)


def _nb28_pg_inputs(rng):
    """(theta (K,), ys (N,), r (N,), lr, alpha): K in 2..6, N in 1..8."""
    K, N = int(rng.integers(2, 7)), int(rng.integers(1, 9))
    return (rng.normal(size=K), rng.integers(0, K, size=N), rng.uniform(0, 1, size=N),
            float(rng.uniform(0.1, 1.0)), float(rng.uniform(0.0, 0.5)))


def test_nb28_self_play_rewards_and_pg_step():
    from agentrl_lib.algorithms import spo

    def right_rewards(wins):
        N = len(wins)
        return np.array([sum(wins[i][j] for j in range(N) if j != i) / (N - 1) for i in range(N)])

    def wrong_rewards(wins):  # the row mean: reads the diagonal and divides by N
        return np.asarray(wins, dtype=float).mean(1)

    def right_pg(theta, ys, r, lr, alpha, soft=True):
        pi = np.exp(theta - theta.max())
        pi /= pi.sum()
        r_soft = np.array([r[i] - (alpha * np.log(pi[y]) if soft else 0.0) for i, y in enumerate(ys)])
        g = np.zeros(len(theta))
        for i, y in enumerate(ys):
            grad_logp = -pi.copy()
            grad_logp[y] += 1.0
            g += (r_soft[i] - r_soft.mean()) * grad_logp / len(ys)
        return theta + lr * g

    _answerable(right_rewards, wrong_rewards, spo.self_play_rewards, _nb28_wins_inputs)
    _answerable(right_pg, lambda *a: right_pg(*a, soft=False),  # drops the entropy bonus
                lambda *a: spo.pg_step(*a)[0], _nb28_pg_inputs)


# 29_inpo
def _nb29_omd_inputs(rng):
    """(pi_t (K,), ref_probs (K,), P (K, K), beta, eta): K in 2..6, P + P^T = 1, eta beta <= 1."""
    K = int(rng.integers(2, 7))
    upper = np.triu(rng.uniform(0, 1, size=(K, K)), 1)
    P = upper + np.tril(1 - upper.T, -1) + 0.5 * np.eye(K)
    beta_ = float(rng.uniform(0.05, 1.0))
    return (rng.dirichlet(np.ones(K)), rng.dirichlet(np.ones(K)), P, beta_,
            float(rng.uniform(0.1, 1.0 / beta_)))


def test_nb29_omd_update():
    from agentrl_lib.algorithms import inpo

    def right(pi_t, ref, P, beta, eta, transpose=False):
        K = len(pi_t)
        win = [sum((P[j][y] if transpose else P[y][j]) * pi_t[j] for j in range(K)) for y in range(K)]
        logits = [(1 - eta * beta) * np.log(pi_t[y]) + eta * beta * np.log(ref[y]) + eta * win[y]
                  for y in range(K)]
        w = np.exp(np.array(logits) - max(logits))
        return w / w.sum()

    _answerable(right, lambda *a: right(*a, transpose=True),  # P^T pi_t: the rate of losing
                inpo.omd_update, _nb29_omd_inputs)


# 30_multiturn_agent
def _nb30_turn_inputs(rng):
    """(episodes,): 2-8 hand-made episodes in 1-3 groups, 1-4 turns each, rewards 0 or 1."""
    from agentrl_lib.rollout import Episode

    return ([Episode.of(["s"] * T, rng.choice([0.0, 0.0, 1.0], size=T).tolist(),
                        group_id=int(rng.integers(0, 3)))
             for T in rng.integers(1, 5, size=int(rng.integers(2, 9)))],)


def _nb30_token_inputs(rng):
    """(episodes, turn_adv): 1-4 token-level episodes, each turn an observation of 0-3 tokens
    (none before the first action: o_0 is in the prompt) then an action of 1-4 tokens."""
    from agentrl_lib.rollout import Episode

    episodes, advs = [], []
    for _ in range(int(rng.integers(1, 5))):
        T = int(rng.integers(1, 5))
        mask, spans = [], []
        for t in range(T):
            mask += [0] * (int(rng.integers(0, 4)) if t else 0)  # the environment's tokens
            spans.append((len(mask), len(mask) + int(rng.integers(1, 5))))
            mask += [1] * (spans[-1][1] - spans[-1][0])  # the agent's action tokens
        episodes.append(Episode.of(["s"] * T, [0.0] * T, token_ids=rng.integers(0, 50, len(mask)).tolist(),
                                   loss_mask=mask, turn_spans=spans))
        advs.append(rng.normal(size=T))
    return episodes, advs


def test_nb30_grpo_broadcast_and_token_advantages():
    from agentrl_lib.algorithms import credit

    def right_broadcast(episodes, by_group=True):
        returns = np.array([sum(ep.rewards) for ep in episodes])
        adv = np.zeros(len(episodes))
        keys = [ep.group_id if by_group else 0 for ep in episodes]
        for g in set(keys):
            idx = [i for i, k in enumerate(keys) if k == g]
            adv[idx] = _normalise(returns[idx])
        return [np.full(len(ep), a) for ep, a in zip(episodes, adv)]

    def right_tokens(episodes, turn_adv, with_observations=False):
        out = []
        for ep, adv in zip(episodes, turn_adv):
            x = np.zeros(len(ep.token_ids))
            for t, (start, end) in enumerate(ep.turn_spans):
                if with_observations:  # also credits the observation before the action
                    start = ep.turn_spans[t - 1][1] if t else 0
                x[start:end] = adv[t]
            out.append(x)
        return out

    _answerable(right_broadcast, lambda e: right_broadcast(e, by_group=False),  # one batch-wide group
                credit.grpo_broadcast, _nb30_turn_inputs)
    _answerable(right_tokens, lambda e, a: right_tokens(e, a, with_observations=True),
                credit.to_token_advantages, _nb30_token_inputs)


# 31_gigpo
def _nb31_gigpo_inputs(rng):
    """(episodes, gamma, omega, norm_adv): 2-8 episodes in 1-2 groups, 1-5 turns from the states
    a, b, c, sparse 0/1 rewards."""
    from agentrl_lib.rollout import Episode

    episodes = [Episode.of(rng.choice(list("abc"), size=T).tolist(), rng.choice([0.0, 0.0, 0.0, 1.0], size=T).tolist(),
                           group_id=int(rng.integers(0, 2)))
                for T in rng.integers(1, 6, size=int(rng.integers(2, 9)))]
    return episodes, float(rng.uniform(0.5, 1.0)), float(rng.uniform(0.0, 2.0)), bool(rng.random() < 0.5)


def test_nb31_gigpo():
    from agentrl_lib.algorithms import credit

    def right(episodes, gamma, omega, norm_adv, anchors_within_group=True):
        rtg = [[sum(gamma ** (k - t) * ep.rewards[k] for k in range(t, len(ep))) for t in range(len(ep))]
               for ep in episodes]
        a_e = np.zeros(len(episodes))
        for g in {ep.group_id for ep in episodes}:
            idx = [i for i, ep in enumerate(episodes) if ep.group_id == g]
            a_e[idx] = _normalise([sum(episodes[i].rewards) for i in idx], norm_adv)
        anchors = {}
        for i, ep in enumerate(episodes):
            for t, s in enumerate(ep.state_keys):
                key = (ep.group_id, s) if anchors_within_group else s
                anchors.setdefault(key, []).append((i, t))
        out = [np.full(len(ep), a_e[i]) for i, ep in enumerate(episodes)]
        for members in anchors.values():
            for (i, t), a in zip(members, _normalise([rtg[i][t] for i, t in members], norm_adv)):
                out[i][t] += omega * a
        return out

    _answerable(right, lambda *a: right(*a, anchors_within_group=False),  # pools anchors across groups
                lambda eps, g, w, n: credit.gigpo_advantages(eps, gamma=g, omega=w, norm_adv=n),
                _nb31_gigpo_inputs)
