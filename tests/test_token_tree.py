"""TokenTreeMDP: exact values against brute-force enumeration and sampling."""

import itertools
import math

import torch

from agentrl_lib.envs.token_tree import TokenTreeMDP
from agentrl_lib.models.policies import TabularTreePolicy


def brute_force_value(tree, probs, prefix):
    """E[reward | prefix] by enumerating every completion."""
    d = len(prefix)
    total = 0.0
    for rest in itertools.product(range(tree.V), repeat=tree.H - d):
        path, p, node = list(prefix) + list(rest), 1.0, 0
        for depth, a in enumerate(path):
            if depth >= d:
                p *= probs[depth][node, a].item()
            node = node * tree.V + a
        total += p * tree.reward[node].item()
    return total


def test_leaf_indexing_roundtrip():
    tree = TokenTreeMDP(3, 4, num_correct=5, seed=1)
    ids = torch.arange(tree.num_leaves)
    toks = tree.tokens(ids)
    assert all(tree.leaf_id(t.tolist()) == i for t, i in zip(toks, ids.tolist()))


def test_uniform_q_by_hand():
    # V=2, H=2, correct leaves (0,1) and (1,1): Q^unif(root, a) = 1/2 for both actions,
    # Q^unif at node 0 = [0, 1], at node 1 = [0, 1]
    tree = TokenTreeMDP(2, 2, correct=[(0, 1), (1, 1)])
    q = tree.uniform_q()
    assert torch.allclose(q[0], torch.tensor([[0.5, 0.5]], dtype=torch.float64))
    assert torch.allclose(q[1], torch.tensor([[0.0, 1.0], [0.0, 1.0]], dtype=torch.float64))
    assert tree.expected_reward(tree.uniform_policy()).item() == 0.5


def test_values_match_brute_force():
    tree = TokenTreeMDP(3, 3, num_correct=4, seed=0)
    g = torch.Generator().manual_seed(0)
    probs = [torch.softmax(torch.randn(3**d, 3, generator=g, dtype=torch.float64), -1)
             for d in range(3)]
    v, q = tree.values(probs)
    assert math.isclose(v[0][0].item(), brute_force_value(tree, probs, []), rel_tol=1e-12)
    for a, b in [(0, 1), (2, 2)]:
        assert math.isclose(q[1][a, b].item(), brute_force_value(tree, probs, [a, b]), rel_tol=1e-12)
    # uniform Q is the value under the uniform policy; optimal Q is 1 where a correct leaf is below
    _, q_unif = tree.values(tree.uniform_policy())
    assert all(torch.allclose(x, y) for x, y in zip(q_unif, tree.uniform_q()))
    assert all(((x > 0).double() == y).all() for x, y in zip(tree.uniform_q(), tree.optimal_q()))


def test_leaf_distribution_and_pass_at_k():
    tree = TokenTreeMDP(4, 3, num_correct=6, seed=2)
    probs = [torch.softmax(torch.randn(4**d, 4, dtype=torch.float64), -1) for d in range(3)]
    p = tree.leaf_distribution(probs)
    assert math.isclose(p.sum().item(), 1.0, rel_tol=1e-12)
    j = tree.expected_reward(probs)
    assert torch.allclose(p[tree.correct_ids].sum(), j)
    assert torch.allclose(tree.pass_at_k(probs, 4), 1 - (1 - j) ** 4)


def test_sampling_matches_exact():
    tree = TokenTreeMDP(4, 3, num_correct=10, seed=3)
    probs = [torch.softmax(torch.randn(4**d, 4, dtype=torch.float64), -1) for d in range(3)]
    g = torch.Generator().manual_seed(0)
    toks, nodes, leaves, rew = tree.sample(probs, 20000, generator=g)
    assert torch.equal(leaves, torch.tensor([tree.leaf_id(t.tolist()) for t in toks[:50]] +
                                            leaves[50:].tolist()))
    j = tree.expected_reward(probs).item()
    assert abs(rew.mean().item() - j) < 4 * math.sqrt(j * (1 - j) / 20000)
    # expected distinct correct leaves among n samples vs the empirical count over repeats
    n, counts = 30, []
    for _ in range(300):
        _, _, lv, r = tree.sample(probs, n, generator=g)
        counts.append(len(set(lv[r > 0].tolist())))
    exp = tree.expected_distinct_correct(probs, n).item()
    sd = torch.tensor(counts, dtype=torch.float64).std().item()
    assert abs(sum(counts) / len(counts) - exp) < 4 * sd / math.sqrt(300)


def test_policy_log_prob_and_exact_gradient():
    tree = TokenTreeMDP(3, 2, num_correct=2, seed=0)
    pol = TabularTreePolicy(tree)
    toks, nodes, _, _ = tree.sample(pol.probs(), 5)
    lp = pol.log_prob(nodes, toks)
    assert torch.allclose(lp, torch.full((5, 2), math.log(1 / 3), dtype=torch.float64))
    tree.expected_reward(pol.probs()).backward()
    # at the uniform policy, d J / d logit(root, a) = pi(a) (Q(a) - V) = (1/3)(Q^unif(a) - J)
    q0 = tree.uniform_q()[0][0]
    j = tree.expected_reward(tree.uniform_policy())
    assert torch.allclose(pol.logits[0].grad[0], (q0 - j) / 3)
