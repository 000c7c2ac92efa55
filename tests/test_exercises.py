"""exercises.check: a right answer passes, a wrong one fails naming the input, a stub is 'not
attempted'; outputs compared leaf by leaf (tensors, arrays, tuples, dicts)."""

import numpy as np
import pytest
import torch

from agentrl_lib import core
from agentrl_lib.exercises import ExerciseError, check


def gen(rng):
    return torch.tensor(rng.normal(size=5)), float(rng.uniform(0.5, 0.99))


def test_right_wrong_and_stub_answers(capsys):
    def right(r, gamma):
        out, g = torch.zeros_like(r), 0.0
        for t in reversed(range(len(r))):
            g = r[t] + gamma * g
            out[t] = g
        return out

    def wrong(r, gamma):  # forgets the discount
        return torch.flip(torch.cumsum(torch.flip(r, [0]), 0), [0])

    def stub(r, gamma):
        raise NotImplementedError

    assert check(right, core.discounted_returns, gen) is True
    assert "correct on 20 random inputs" in capsys.readouterr().out
    with pytest.raises(ExerciseError, match="wrong differs from the reference at trial 0"):
        check(wrong, core.discounted_returns, gen)
    assert check(stub, core.discounted_returns, gen) is False
    assert "not attempted yet" in capsys.readouterr().out


def test_structured_outputs_and_keyword_inputs():
    ref = lambda x, k=1: (x * k, {"sum": float(np.sum(x)), "n": len(x)})  # noqa: E731
    good = lambda x, k=1: (np.asarray(x) * k, {"sum": float(np.sum(x)), "n": len(x)})  # noqa: E731
    bad_shape = lambda x, k=1: (np.asarray(x)[:-1] * k, {"sum": 0.0, "n": len(x)})  # noqa: E731
    inputs = lambda rng: {"x": rng.normal(size=3), "k": int(rng.integers(1, 4))}  # noqa: E731
    assert check(good, ref, inputs)
    with pytest.raises(ExerciseError, match="largest difference: inf"):
        check(bad_shape, ref, inputs)
    # within tolerance passes, beyond it fails
    assert check(lambda x: x + 1e-9, lambda x: x, lambda rng: (rng.normal(size=4),))
    with pytest.raises(ExerciseError):
        check(lambda x: x + 1e-3, lambda x: x, lambda rng: (rng.normal(size=4),))


# --- The notebooks' checked exercises are answerable: for each, a right solution written here
# (independently of the library's code) passes `check` against the notebook's reference on the
# notebook's input generator (copied verbatim), and a plausible wrong one fails.

def _answerable(right, wrong, reference, make_inputs):
    assert check(right, reference, make_inputs) is True
    with pytest.raises(ExerciseError):
        check(wrong, reference, make_inputs)


# 01_mdp_dynamic_programming
def _nb01_exercise_mdp(rng):
    import dataclasses

    from agentrl_lib.envs import tabular as T

    S, A = int(rng.integers(2, 8)), int(rng.integers(1, 4))
    m = T.random_mdp(S, A, gamma=float(rng.uniform(0.5, 0.99)), seed=int(rng.integers(1 << 31)))
    m = dataclasses.replace(m, terminal=torch.as_tensor(rng.random(S) < 0.3))
    return m, torch.as_tensor(rng.dirichlet(np.ones(A), size=S))  # pi: (S, A)


def _nb01_exercise_mdp_v(rng):
    m, _ = _nb01_exercise_mdp(rng)
    return m, torch.as_tensor(rng.normal(size=m.num_states))


def test_nb01_policy_evaluation_and_q_from_v():
    from agentrl_lib.algorithms import dp

    def right_eval(mdp, pi):  # iterate the Bellman expectation operator to its fixed point
        P, R, live = mdp.P.numpy(), mdp.R.numpy(), ~mdp.terminal.numpy()
        pi = np.asarray(pi)
        V = np.zeros(len(live))
        for _ in range(5000):
            V = live * ((pi * R).sum(1) + mdp.gamma * np.einsum("sa,sat,t->s", pi, P, V))
        return V

    def wrong_eval(mdp, pi):  # forgets that terminal states collect nothing
        P, R = mdp.P.numpy(), mdp.R.numpy()
        pi = np.asarray(pi)
        P_pi = np.einsum("sa,sat->st", pi, P)
        return np.linalg.solve(np.eye(len(P)) - mdp.gamma * P_pi, (pi * R).sum(1))

    def right_q(mdp, v):
        S, A = mdp.R.shape
        Q = np.zeros((S, A))
        for s in range(S):
            for a in range(A):
                if not mdp.terminal[s]:
                    Q[s, a] = float(mdp.R[s, a]) + mdp.gamma * float(mdp.P[s, a] @ v)
        return Q

    def wrong_q(mdp, v):  # no zero at terminal states
        return mdp.R + mdp.gamma * torch.einsum("sat,t->sa", mdp.P, v)

    _answerable(right_eval, wrong_eval, dp.policy_evaluation, _nb01_exercise_mdp)
    _answerable(right_q, wrong_q, dp.q_from_v, _nb01_exercise_mdp_v)


# 02_policy_gradients
def _nb02_rloo_inputs(rng):
    B, G = int(rng.integers(1, 5)), int(rng.integers(2, 9))
    return (torch.tensor(rng.normal(size=(B, G))),)


def _nb02_scale_inputs(rng):
    return float(rng.uniform(0.02, 0.98)), int(rng.integers(2, 9))


def test_nb02_rloo_and_grpo_scale():
    import itertools

    from agentrl_lib.algorithms import pg

    def right_rloo(r):  # the (G-1)/G identity
        G = r.shape[-1]
        return G / (G - 1) * (r - r.mean(-1, keepdim=True))

    def wrong_rloo(r):  # the mean includes sample i (Dr. GRPO)
        return r - r.mean(-1, keepdim=True)

    def grpo_scale_by_enumeration(p, G, ddof):
        """sum over all 2^G reward patterns of P(pattern) A_1 (r_1/p - (1-r_1)/(1-p))."""
        total = 0.0
        for rs in itertools.product((0.0, 1.0), repeat=G):
            r = np.array(rs)
            prob = np.prod(np.where(r == 1, p, 1 - p))
            a1 = (r[0] - r.mean()) / (r.std(ddof=ddof) + 1e-4)
            total += prob * a1 * (r[0] / p - (1 - r[0]) / (1 - p))
        return total

    _answerable(right_rloo, wrong_rloo, core.rloo_advantages, _nb02_rloo_inputs)
    _answerable(lambda p, G: grpo_scale_by_enumeration(p, G, 1),
                lambda p, G: grpo_scale_by_enumeration(p, G, 0),  # the population std
                lambda p, G: pg.expected_gradient_scale(p, G, "grpo"), _nb02_scale_inputs)


# 03_ppo_gae
def _nb03_gae_inputs(rng):
    B, T = int(rng.integers(1, 4)), int(rng.integers(1, 9))
    return (torch.tensor(rng.normal(size=(B, T))), torch.tensor(rng.normal(size=(B, T))),
            torch.tensor((rng.random((B, T)) < 0.25).astype(float)), torch.tensor(rng.normal(size=B)),
            float(rng.uniform(0.8, 1.0)), float(rng.uniform(0.0, 1.0)))


def _nb03_ppo_inputs(rng):
    n = int(rng.integers(1, 17))
    old = torch.tensor(-rng.uniform(0.1, 3.0, size=n))
    return old + torch.tensor(rng.normal(scale=0.3, size=n)), old, torch.tensor(rng.normal(size=n))


def test_nb03_gae_and_ppo_loss():
    def gae_sum(r, v, done, v_last, gamma, lam, carry_over_ends):
        """A_t = sum_l (gamma lam)^l delta_{t+l}, stopped after an episode's end (unless told not to)."""
        r, v, done, v_last = (np.asarray(x, dtype=float) for x in (r, v, done, v_last))
        B, T = r.shape
        adv = np.zeros((B, T))
        for b in range(B):
            v_next = np.append(v[b, 1:], v_last[b])
            stop = done[b] if not carry_over_ends else np.zeros(T)
            delta = r[b] + gamma * v_next * (1 - stop) - v[b]
            for t in range(T):
                weight = 1.0
                for k in range(t, T):
                    adv[b, t] += weight * delta[k]
                    if stop[k]:
                        break
                    weight *= gamma * lam
        return adv, adv + v

    def right_ppo(lp, old, a):
        ratio = np.exp(np.asarray(lp) - np.asarray(old))
        a = np.asarray(a)
        return -np.mean(np.minimum(ratio * a, np.clip(ratio, 0.8, 1.2) * a))

    def wrong_ppo(lp, old, a):  # clips without the min: no pessimism
        ratio = np.exp(np.asarray(lp) - np.asarray(old))
        return -np.mean(np.clip(ratio, 0.8, 1.2) * np.asarray(a))

    _answerable(lambda *x: gae_sum(*x, carry_over_ends=False),
                lambda *x: gae_sum(*x, carry_over_ends=True), core.gae_advantages, _nb03_gae_inputs)
    _answerable(right_ppo, wrong_ppo, lambda lp, old, a: core.ppo_clip_loss(lp, old, a)[0],
                _nb03_ppo_inputs)


# 04_rover
def _nb04_tree_inputs(rng):
    from agentrl_lib.envs.token_tree import TokenTreeMDP

    V, H = int(rng.integers(2, 5)), int(rng.integers(1, 4))
    return (TokenTreeMDP(V, H, num_correct=int(rng.integers(1, min(8, V**H) + 1)),
                         seed=int(rng.integers(1 << 31))),)


def _nb04_tree_policy_inputs(rng):
    (tree_x,) = _nb04_tree_inputs(rng)
    probs = [torch.softmax(torch.tensor(2 * rng.normal(size=(tree_x.V**d, tree_x.V))), -1)
             for d in range(tree_x.H)]
    return tree_x, probs, int(rng.integers(1, 257))


def _leaf_tokens(leaf, V, H):
    tokens = []
    for _ in range(H):
        leaf, a = divmod(leaf, V)
        tokens.append(a)
    return tokens[::-1]


def test_nb04_uniform_q_and_distinct_correct():
    def q_by_counting(tree, best=False):
        """Per depth, count the correct leaves below each child (or whether there is one)."""
        V, H = tree.V, tree.H
        out = []
        for d in range(H):
            q = np.zeros((V**d, V))
            for leaf in range(V**H):
                toks = _leaf_tokens(leaf, V, H)
                node = 0
                for a in toks[:d]:
                    node = node * V + a
                r = float(tree.reward[leaf])
                q[node, toks[d]] = max(q[node, toks[d]], r) if best else q[node, toks[d]] + r
            out.append(q if best else q / V ** (H - d - 1))
        return out

    def distinct(tree, probs, n, with_repeats=False):
        total = 0.0
        for leaf in tree.correct_ids.tolist():
            p, node = 1.0, 0
            for d, a in enumerate(_leaf_tokens(leaf, tree.V, tree.H)):
                p *= float(probs[d][node, a])
                node = node * tree.V + a
            total += n * p if with_repeats else 1.0 - (1.0 - p) ** n
        return total

    _answerable(q_by_counting, lambda t: q_by_counting(t, best=True),  # Q* instead of Q^u
                lambda t: t.uniform_q(), _nb04_tree_inputs)
    _answerable(distinct, lambda t, p, n: distinct(t, p, n, with_repeats=True),  # counts repeats
                lambda t, p, n: t.expected_distinct_correct(p, n), _nb04_tree_policy_inputs)


# 10_tiny_lm
def _nb10_logits_inputs(rng):
    B, T, V = int(rng.integers(1, 4)), int(rng.integers(1, 7)), int(rng.integers(2, 13))
    return (torch.tensor(2 * rng.normal(size=(B, T, V)), dtype=torch.float32),
            torch.tensor(rng.integers(0, V, size=(B, T))), float(rng.uniform(0.3, 2.0)))


def _nb10_chat_inputs(rng):
    a, b = rng.integers(0, 1000, size=2)
    return f"{a}+{b}=", "".join(str(d) for d in rng.integers(0, 10, size=int(rng.integers(0, 5))))


def test_nb10_logps_and_chat_example():
    from agentrl_lib.models.tiny_lm import build_tokenizer
    from agentrl_lib.rollout import chat_example, logps_from_logits

    def right_logps(logits, ids, temperature, scale=True):
        z = np.asarray(logits, dtype=np.float64) / (temperature if scale else 1.0)  # (B, T, V)
        z = z - z.max(-1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
        picked = np.take_along_axis(logp, np.asarray(ids)[..., None], -1)[..., 0]
        return picked, -(np.exp(logp) * logp).sum(-1)

    tok = build_tokenizer()

    def right_chat(prompt, completion, eos_in_mask=True):
        head = f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n"
        ids = tok(head + completion + tok.eos_token, add_special_tokens=False)["input_ids"]
        n = len(completion) + 1  # one token per character, then the end-of-turn token
        return ids, [0] * (len(ids) - n) + [1] * (n - 1) + [1 if eos_in_mask else 0]

    # the reference works in float32: the notebook checks with atol=1e-5, and so does this
    assert check(right_logps, logps_from_logits, _nb10_logits_inputs, atol=1e-5)
    with pytest.raises(ExerciseError):  # ignores the temperature
        check(lambda *x: right_logps(*x, scale=False), logps_from_logits, _nb10_logits_inputs,
              atol=1e-5)
    _answerable(right_chat, lambda p, c: right_chat(p, c, eos_in_mask=False),
                lambda p, c: chat_example(tok, p, c), _nb10_chat_inputs)


# 12_tricks_or_traps
def _nb12_aggregate_inputs(rng):
    B, T = int(rng.integers(1, 5)), int(rng.integers(1, 9))
    lengths = rng.integers(0, T + 1, size=B)
    mask = torch.tensor((np.arange(T)[None] < lengths[:, None]).astype(float))
    return torch.tensor(rng.normal(size=(B, T))), mask, str(rng.choice(core.AGGREGATIONS))


def _nb12_normalised_inputs(rng):
    B, G = int(rng.integers(1, 5)), int(rng.integers(2, 9))
    rewards = torch.tensor(rng.integers(0, 2, size=(B, G)), dtype=torch.float64)
    return rewards, str(rng.choice(core.ADV_LEVELS)), str(rng.choice(core.ADV_LEVELS))


def test_nb12_aggregate_and_normalised():
    def right_aggregate(x, mask, how, drop_empty=False):
        x, m = np.asarray(x), np.asarray(mask)
        B, T = x.shape
        if how == "token_mean":
            return (x * m).sum() / max(m.sum(), 1.0)
        if how == "const_norm":
            return (x * m).sum() / (B * T)
        means = [(x[b] * m[b]).sum() / m[b].sum() for b in range(B) if m[b].sum() > 0]
        n = len(means) if drop_empty else B
        return sum(means) / max(n, 1)

    def right_normalised(r, mean_level, std_level, ddof=1):
        r = np.asarray(r)
        B, G = r.shape
        out = np.zeros((B, G))
        for b in range(B):
            for i in range(G):
                pool_m = r[b] if mean_level == "group" else r.reshape(-1)
                pool_s = r[b] if std_level == "group" else r.reshape(-1)
                a = r[b, i] - (0.0 if mean_level == "none" else pool_m.mean())
                if std_level != "none":
                    a /= pool_s.std(ddof=ddof) + 1e-4
                if mean_level != "none" and pool_m.min() == pool_m.max():
                    a = 0.0
                out[b, i] = a
        return out

    _answerable(right_aggregate, lambda *a: right_aggregate(*a, drop_empty=True),  # skips empties
                core.aggregate, _nb12_aggregate_inputs)
    _answerable(right_normalised, lambda *a: right_normalised(*a, ddof=0),  # the population std
                core.normalised_advantages, _nb12_normalised_inputs)
