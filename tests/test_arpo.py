"""ARPO / AEPO (algorithms/arpo.py) and the crux menu (envs/calc_crux.py): numbers by hand."""

import math

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import arpo, credit
from agentrl_lib.envs.calc_crux import ACTIONS, CalcCruxEnv
from agentrl_lib.models.policies import KeyTablePolicy
from agentrl_lib.rollout import Episode, play_episodes


def test_entropy_change_score_and_budget_split():
    assert arpo.entropy([0.5, 0.5]) == pytest.approx(math.log(2))
    assert arpo.entropy([1.0, 0.0]) == 0.0
    assert arpo.entropy_change(1.0, 0.4, 2.0) == pytest.approx(0.3)
    # alpha + beta dH (ARPO's score)
    assert arpo.branch_score(0.3, 0.5, 2.0) == pytest.approx(1.1)
    assert arpo.branch_score(-0.5, 0.5, 1.0) == pytest.approx(0.0)
    # AEPO's pre-monitoring, the code's form: N = int(M sigma(kappa (H_root - H_tool) / H_max)) + 1
    # sigma(2) = 0.8808 -> int(7.05) + 1 = 8 of 8; sigma(0.25) = 0.5622 -> int(4.50) + 1 = 5
    assert arpo.global_count(8, 2.0, 1.0, 4.0, 2.0) == 8
    assert arpo.global_count(8, 1.5, 1.0, 1.0, 2.0) == 5
    assert arpo.global_count(8, 0.0, 4.0, 100.0, 1.0) == 1  # never below one global sample
    # the released rule: P = clip(0.5 + 0.2 dH, 0, 1) (alpha, beta: the code's defaults)
    assert arpo.branch_probability(0.5) == pytest.approx(0.6)
    assert arpo.branch_probability(-1.0) == pytest.approx(0.3)
    assert arpo.branch_probability(3.0) == 1.0 and arpo.branch_probability(-3.0) == 0.0
    # AEPO's released draw: (u + beta dH) f >= alpha, f = max(0, 1 - 0.05 l):
    # l = 4 -> f = 0.8, P = 1 - 0.5 / 0.8 + 0.2 * 0.5 = 0.475; l = 20 -> f = 0 -> never
    assert arpo.aepo_branch_probability(0.5, consecutive=4) == pytest.approx(0.475)
    assert arpo.aepo_branch_probability(3.0, consecutive=20) == 0.0
    assert arpo.aepo_branch_probability(0.5) == pytest.approx(arpo.branch_probability(0.5))
    with pytest.raises(ValueError, match="penalty"):
        arpo.penalty_factor(1, penalty=-0.1)
    with pytest.raises(ValueError, match="h_max"):
        arpo.entropy_change(1.0, 0.0, 0.0)


def test_attribution_hard_and_soft_by_hand():
    # three leaves: 0 and 1 share node 0, all three share nothing else; leaf 2 is its own path
    node_ids = [[0, 1, 2], [0, 3], [4, 5]]
    leaf = np.array([1.0, -0.5, 0.2])
    soft = arpo.attribute(node_ids, leaf, "soft")
    assert [a.tolist() for a in soft] == [[1.0] * 3, [-0.5] * 2, [0.2] * 2]
    hard = arpo.attribute(node_ids, leaf, "hard")
    # node 0 (paper sec. 3.2): mean(1, -0.5) = 0.25 on each copy; the copies sum to 2 x the mean,
    # as soft's 1 + (-0.5) = 0.5 does
    assert hard[0].tolist() == [0.25, 1.0, 1.0] and hard[1].tolist() == [0.25, -0.5]
    assert hard[2].tolist() == [0.2, 0.2]
    assert hard[0][0] + hard[1][0] == pytest.approx(soft[0][0] + soft[1][0]) == 0.5
    split = arpo.attribute(node_ids, leaf, "hard_split")  # the variant: 0.25 / 2 on each copy
    assert split[0].tolist() == [0.125, 1.0, 1.0] and split[1].tolist() == [0.125, -0.5]
    # without sharing both modes are the leaf advantage on every step
    flat = [[0, 1], [2, 3]]
    assert all(np.array_equal(a, b) for a, b in zip(arpo.attribute(flat, [1.0, -1.0], "hard"),
                                                   arpo.attribute(flat, [1.0, -1.0], "soft")))
    with pytest.raises(ValueError, match="attribution"):
        arpo.attribute(flat, [1.0, -1.0], "mean")
    with pytest.raises(ValueError, match="leaves"):
        arpo.attribute(flat, [1.0], "soft")


def test_leaf_advantages_are_grpo_and_entropy_weighting():
    r = np.array([1.0, 0.0, 0.0, 1.0])
    expected = (r - 0.5) / (r.std(ddof=1) + 1e-4)
    assert np.allclose(arpo.leaf_advantages(r), expected)
    assert np.all(arpo.leaf_advantages([1.0, 1.0, 1.0]) == 0.0)
    # entropies 1, 3 (one leaf) and 2 (another): mean 2, unbiased std 1 -> z = -1, 1, 0
    out = arpo.entropy_aware_advantages([np.array([2.0, -1.0]), np.array([4.0])],
                                        [np.array([1.0, 3.0]), np.array([2.0])], 0.2)
    assert out[0].tolist() == pytest.approx([2.0 * 0.8, -1.0 * 1.2]) and out[1][0] == 4.0
    # constant entropies: std := 1, z = 0, the advantages unchanged
    same = arpo.entropy_aware_advantages([np.array([1.0, -1.0])], [np.array([0.7, 0.7])], 0.2)
    assert same[0].tolist() == [1.0, -1.0]


def test_sg_clip_keeps_the_gradient_where_ppo_clips():
    old = torch.log(torch.tensor([0.5, 0.5, 0.5], dtype=torch.float64))
    adv = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    # rho = 1.5 (clipped, A > 0), 1.1 (inside), 1.5 with A < 0 (not clipped by min)
    new = torch.log(torch.tensor([0.75, 0.55, 0.75], dtype=torch.float64)).requires_grad_(True)
    eps = 0.2
    ppo = -torch.min(torch.exp(new - old) * adv,
                     torch.exp(new - old).clamp(1 - eps, 1 + eps) * adv)
    (g_ppo,) = torch.autograd.grad(ppo.sum(), new)
    sg = arpo.sg_clip_loss(new, old, adv, eps)
    (g_sg,) = torch.autograd.grad(sg.sum(), new)
    assert torch.allclose(sg.detach(), ppo.detach())  # same values
    assert g_ppo[0] == 0.0 and g_sg[0].item() == pytest.approx(-(1 + eps) * 1.0)
    assert g_sg[1:].tolist() == pytest.approx(g_ppo[1:].tolist())  # -rho A elsewhere
    assert g_sg[1].item() == pytest.approx(-1.1)
    # an entropy threshold limits the change to high-entropy steps
    low = arpo.sg_clip_loss(new, old, adv, eps, torch.tensor([0.1, 0.1, 0.1]), 0.5)
    (g_low,) = torch.autograd.grad(low.sum(), new)
    assert g_low[0] == 0.0
    with pytest.raises(ValueError, match="entropies"):
        arpo.sg_clip_loss(new, old, adv, eps, None, 0.5)


def test_branch_probability_is_the_released_rule():
    """The code's draw (``generate_sequences``): prob = clip(u - 0.2 dH, 0, 1), no branch where
    prob > 0.5; its branching frequency over many draws equals clip(0.5 + 0.2 dH, 0, 1)."""
    u = np.random.default_rng(0).random(200_000)
    for dh in (-4.0, -1.0, 0.0, 0.7, 3.0):
        code = np.clip(u - 0.2 * dh, 0.0, 1.0) <= 0.5
        p = arpo.branch_probability(dh, 0.5, 0.2)
        assert abs(code.mean() - p) < 4 * math.sqrt(max(p * (1 - p), 1e-6) / len(u)) + 1e-9


def _policy_uncertain_after_tools():
    """A table sure at the start (lookup, p = 0.99) and uniform after a lookup."""
    pol = KeyTablePolicy(len(ACTIONS), seed=0)
    with torch.no_grad():
        pol.logits[pol.row(("start",)), 0] = 10.0
        pol.logits[pol.row(("calc",)), ACTIONS.index("answer")] = 10.0
    return pol


def test_tree_rollout_forks_share_prefixes_and_pay_tool_calls_once():
    pol = _policy_uncertain_after_tools()
    cfg = arpo.ARPOConfig(rollout="arpo", group_size=8, num_global=2, num_branches=2)
    crux = lambda key: float(key[0] == "lookup")  # noqa: E731  fork right after every lookup
    tree = arpo.tree_rollout(CalcCruxEnv, pol, 3, cfg, np.random.default_rng(0), fork_fn=crux)
    assert len(tree.episodes) == 8 and tree.forks == 3  # 2 global + 3 forks x 2 leaves
    assert min(tree.fork_depths) >= 1  # after a lookup's response (never at the start)
    # each fork's leaves share the first step (the lookup) with their parent
    first = [ids[0] for ids in tree.node_ids]
    assert len(set(first)) == 2
    # tool calls: distinct tool-call nodes; the replayed prefixes are not paid again
    per_leaf = sum(sum(i.get("tool_call", False) for i in ep.infos) for ep in tree.episodes)
    distinct = {n for ep, ids in zip(tree.episodes, tree.node_ids)
                for i, n in zip(ep.infos, ids) if i["tool_call"]}
    assert tree.tool_calls == len(distinct) < per_leaf
    # each fork's Z = 2 leaves reuse its prefix: here only lookups (a tool call each) before a fork
    assert per_leaf - tree.tool_calls == 2 * sum(tree.fork_depths)
    # a fork's replay reproduces the parent's steps: same actions, same observations
    by_node = {}
    for ep, ids in zip(tree.episodes, tree.node_ids):
        for t, n in enumerate(ids):
            by_node.setdefault(n, (ep.action_ids[t], ep.observations[t]))
            assert by_node[n] == (ep.action_ids[t], ep.observations[t])
    # global rollouts: M independent paths, nothing shared, every call paid
    g = arpo.tree_rollout(CalcCruxEnv, pol, 3, arpo.ARPOConfig(rollout="global", group_size=8),
                          np.random.default_rng(0))
    assert g.forks == 0 and len({ids[0] for ids in g.node_ids}) == 8
    assert g.tool_calls == sum(sum(i["tool_call"] for i in ep.infos) for ep in g.episodes)


def test_fork_rules_entropy_and_random():
    """P = 0 everywhere forks nothing; with alpha = 0 and a large beta the entropy rule forks
    exactly where the entropy rose (after the lookup: uniform) and the random rule never."""
    pol = _policy_uncertain_after_tools()
    never = arpo.ARPOConfig(group_size=8, num_global=2, alpha=0.0, beta=0.0)
    assert arpo.tree_rollout(CalcCruxEnv, pol, 3, never, np.random.default_rng(0)).forks == 0
    ent = arpo.ARPOConfig(group_size=8, num_global=2, alpha=0.0, beta=100.0)
    tree = arpo.tree_rollout(CalcCruxEnv, pol, 3, ent, np.random.default_rng(0))
    assert tree.forks == 6  # M - N = 6 forks of Z = 1, all where the entropy rose
    blind = arpo.ARPOConfig(group_size=8, num_global=2, alpha=0.0, beta=100.0, fork_rule="random")
    assert arpo.tree_rollout(CalcCruxEnv, pol, 3, blind, np.random.default_rng(0)).forks == 0
    with pytest.raises(ValueError, match="fork_rule"):
        arpo.ARPOConfig(fork_rule="oracle")


def test_aepo_penalty_and_premonitoring():
    pol = _policy_uncertain_after_tools()
    # penalty 1: after one forking round the factor is 0, so no fork follows a forking round
    cfg = arpo.ARPOConfig(rollout="aepo", group_size=8, num_branches=1, alpha=0.5, beta=0.0,
                          penalty=1.0, kappa=4.0)
    tree = arpo.tree_rollout(CalcCruxEnv, pol, 3, cfg, np.random.default_rng(0))
    assert len(tree.episodes) == 8
    assert tree.forks > 0 and all(c == 0 for c in tree.fork_consecutive)
    # without the penalty the same trees fork after forking rounds (the control of the above)
    free = arpo.ARPOConfig(rollout="aepo", group_size=8, num_branches=1, alpha=0.0, beta=0.0,
                           penalty=0.0, kappa=4.0)
    trees = [arpo.tree_rollout(CalcCruxEnv, pol, s, free, np.random.default_rng(s))
             for s in range(10)]
    assert any(c > 0 for t in trees for c in t.fork_consecutive)
    # H_root ~ 0.08 < H_tool = log 11: int(8 sigma(4 (0.08 - 2.40) / 2.40)) + 1 = int(0.17) + 1
    assert tree.num_global == 1


def test_global_soft_equals_grpo_broadcast():
    pol = KeyTablePolicy(len(ACTIONS), seed=1)
    cfg = arpo.ARPOConfig(rollout="global", group_size=4, attribution="soft")
    rng = np.random.default_rng(1)
    trees = [arpo.tree_rollout(CalcCruxEnv, pol, s, cfg, rng, group_id=g)
             for g, s in enumerate([5, 6, 7])]
    eps = [ep for t in trees for ep in t.episodes]
    ours = arpo.tree_advantages(trees, cfg)
    ref = credit.grpo_broadcast(eps)
    assert all(np.allclose(a, b) for a, b in zip(ours, ref))


def test_train_logs_tool_calls_and_stops_at_the_budget():
    pol = KeyTablePolicy(len(ACTIONS), seed=0)
    cfg = arpo.ARPOConfig(rollout="arpo", num_iters=200, num_prompts=4, group_size=4,
                          num_global=2, max_tool_calls=150, seed=0)
    rows = arpo.train(CalcCruxEnv, pol, cfg, list(range(20)))
    assert rows[-1]["charts/tool_calls"] >= 150 > rows[-2]["charts/tool_calls"]
    assert rows[-1]["charts/tool_calls"] == sum(r["rollout/tool_calls"] for r in rows)
    assert any(r["losses/grad_norm"] > 0 for r in rows)
    with pytest.raises(ValueError, match="rollout"):
        arpo.ARPOConfig(rollout="beam")
    with pytest.raises(ValueError, match="num_global"):
        arpo.ARPOConfig(num_global=9, group_size=8)


def test_crux_env_exact_success():
    env = CalcCruxEnv()
    uniform = env.success_probability(lambda k: np.full(len(ACTIONS), 1 / len(ACTIONS)))
    rng = np.random.default_rng(0)
    eps = play_episodes(CalcCruxEnv, lambda envs, obs: [int(rng.integers(len(ACTIONS)))
                                                       for _ in envs], list(range(4000)), 1)
    mc = np.mean([e.success for e in eps])
    assert abs(mc - uniform) < 4 * math.sqrt(uniform * (1 - uniform) / 4000)

    def expert(k):
        p = np.zeros(len(ACTIONS))
        name = "lookup" if k == ("start",) else ("answer" if k == ("calc",) else f"calc_{k[1]}")
        p[ACTIONS.index(name)] = 1.0
        return p
    assert env.success_probability(expert) == 1.0
    # guessing the calc at the start and answering: 1 in 8 prices
    guess = lambda k: np.eye(len(ACTIONS))[ACTIONS.index("answer") if k == ("calc",) else 2]  # noqa: E731
    assert env.success_probability(guess) == pytest.approx(1 / 8)
    with pytest.raises(ValueError, match="max_turns"):
        CalcCruxEnv(max_turns=2)
    ep = Episode.of(["s"], [1.0])
    assert not arpo.post_tool_mask(ep).any()


def test_paid_tool_calls():
    assert arpo.is_paid_tool_call({"tool": "calc", "valid": True})
    assert not arpo.is_paid_tool_call({"tool": "calc", "valid": False})  # an error executes nothing
    assert not arpo.is_paid_tool_call({"tool": "answer", "valid": True})
    assert not arpo.is_paid_tool_call({"tool": "lookup", "valid": True, "tool_call": False})
    ep = Episode.of(["a", "b", "c"], [0, 0, 1], infos=[{"tool": "lookup", "valid": True},
                                                       {"tool": "confirm", "valid": True},
                                                       {"tool": "answer", "valid": True}])
    assert arpo.count_tool_calls([ep, ep]) == 2
    ep.infos = [{"tool_call": True}, {"tool_call": False}, {}]
    assert arpo.post_tool_mask(ep).tolist() == [False, True, False]


def test_tree_rollout_on_the_kg_menu_replays_forks_exactly():
    from agentrl_lib.envs.kg_search import KGMenuEnv

    def make():
        return KGMenuEnv(hops=(2,), max_turns=6, num_entities=60, num_relations=2, top_k=2)
    pol = KeyTablePolicy(len(KGMenuEnv.actions), seed=0)
    with torch.no_grad():  # sure at the start (search the subject), uniform elsewhere
        pol.logits[pol.row((2, 0, False)), 0] = 8.0  # the start key: (hops, read, found)
    cfg = arpo.ARPOConfig(rollout="arpo", group_size=6, num_global=2, num_branches=2, alpha=1.0,
                          beta=0.0)  # P = 1: fork at every post-tool step while leaves are left
    tree = arpo.tree_rollout(make, pol, 1, cfg, np.random.default_rng(0))
    assert len(tree.episodes) == 6 and tree.forks == 2
    seen = {}
    for ep, ids in zip(tree.episodes, tree.node_ids):
        for t, n in enumerate(ids):  # a replayed step sees the same observation (search_other too)
            assert seen.setdefault(n, (ep.action_ids[t], ep.observations[t])) == (ep.action_ids[t], ep.observations[t])
    paid = {n for ep, ids in zip(tree.episodes, tree.node_ids) for i, n in zip(ep.infos, ids)
            if i["valid"] and i["tool"] in ("search", "open")}
    assert tree.tool_calls == len(paid)


class _EchoTools:
    """Three turns, every call a paid tool call; deterministic given the calls (a replay test bed)."""

    system_prompt = ""

    def reset(self, seed=None):
        self.turn, self.seed = 0, seed
        return f"task {seed}"

    def state_key(self):
        return (self.seed, self.turn)

    def step(self, text):
        self.turn += 1
        done = self.turn >= 3
        return (f"tool said {len(text) % 7}", float(done and len(text) % 2 == 0), done,
                {"valid": True, "tool": "echo", "tool_call": True, "state_key": self.state_key(),
                 "success": bool(done and len(text) % 2 == 0)})


def test_lm_tree_sampler_forks_copy_their_parent_and_fill_the_budget():
    from agentrl_lib.algorithms import grpo
    from agentrl_lib.models.tiny_lm import char_tokenizer, new_model

    model, tok = new_model("tiny-64", seed=0, tokenizer=char_tokenizer())
    cfg = grpo.GRPOConfig(num_prompts=2, group_size=6, max_new_tokens=5, max_turns=3, seed=0)
    tcfg = arpo.ARPOConfig(num_global=2, num_branches=2, alpha=1.0, beta=0.0, group_size=6)
    batch = arpo.lm_tree_sampler(tok, _EchoTools, list(range(10)), cfg, tcfg)(model)
    eps = batch.episodes
    assert len(eps) == 12 and [sum(e.group_id == g for e in eps) for g in (0, 1)] == [6, 6]
    assert batch.metrics["rollout/forks"] == 4  # two forks of two per task fill M - N = 4
    # the leaves come by task, each task's N global episodes first, then its forks
    globals_ = [e for g in (0, 1) for e in [x for x in eps if x.group_id == g][:2]]
    own = 0
    for e in eps:
        assert len(e) == 3 and len(e.turn_spans) == 3
        if any(e is x for x in globals_):
            continue
        # the fork turn t: the longest prefix of turns it shares with a global of its task
        t, p = max((t, p) for p in globals_ if p.group_id == e.group_id for t in (1, 2)
                   if p.token_ids[:p.turn_spans[t][0]] == e.token_ids[:e.turn_spans[t][0]])
        cut = e.turn_spans[t][0]
        assert e.logps[:cut] == p.logps[:cut] and e.loss_mask[:cut] == p.loss_mask[:cut]
        assert e.actions[:t] == p.actions[:t] and e.observations[:t + 1] == p.observations[:t + 1]
        assert all(x != 0.0 for x, m in zip(e.logps[cut:], e.loss_mask[cut:]) if m)  # sampled anew
        own += 3 - t
    # paid calls: every call of the 4 globals, and each fork's calls from its fork turn on
    assert batch.metrics["rollout/tool_calls"] == 4 * 3 + own < arpo.count_tool_calls(eps)
