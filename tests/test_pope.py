"""POPE (agentrl_lib.algorithms.pope): the paper's minimal-prefix search (by hand, on the tree and
the LM), the annealed variant's schedule, the tree's exact success against TokenTreeMDP, forced
prefixes and their mask, zero reward = no update, and the LM sampler's prompt-side prefix in both
prompt forms."""

import random

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import pope
from agentrl_lib.algorithms.grpo import GRPOConfig
from agentrl_lib.envs.text_tasks import make_problems, reference_completion
from agentrl_lib.rollout import format_prompts


def _problems(seed=0):
    return pope.HabitTreeProblems(vocab_size=3, depth=4, num_hard=3, num_easy=2, seed=seed)


def test_schedule_by_hand():
    c = pope.POPEConfig(prefix_start=0.75, prefix_end=0.25, anneal_frac=0.5)
    # 10 rounds: the prefix shrinks over rounds 0..5, 0.75 - 0.5 * it / 5
    assert [round(pope.prefix_fraction(i, 10, c), 3) for i in (0, 1, 5, 8)] == [0.75, 0.65, 0.25, 0.25]
    assert [pope.prefix_len(f, 5) for f in (0.0, 0.19, 0.2, 0.99, 1.0)] == [0, 0, 1, 4, 4]
    assert pope.split_round(8, pope.POPEConfig(easy_frac=0.25)) == (2, 6)
    with pytest.raises(ValueError):
        pope.POPEConfig(guidance="oracle")
    with pytest.raises(ValueError):
        pope.POPEConfig(schedule="shrink")
    with pytest.raises(ValueError):
        pope.POPEConfig(prompt_form="system")


def test_minimal_prefix_by_hand():
    # a problem of 8 steps whose start policy first succeeds with 3 oracle steps: the search tries
    # k = 1, 2, 3 in order and stops there; under the paper's cap (a quarter: k <= 2) it finds none
    tried = []

    def solves(k):
        tried.append(k)
        return k >= 3

    assert pope.minimal_prefix(solves, 8, 0.5) == 3 and tried == [1, 2, 3]
    tried.clear()
    assert pope.minimal_prefix(solves, 8, 0.25) == 0 and tried == [1, 2]
    assert pope.minimal_prefix(lambda k: True, 8, 0.25) == 1  # shortest first
    assert pope.minimal_prefix(lambda k: True, 3, 0.25) == 0  # floor(0.75) = 0: nothing to try
    assert pope.minimal_prefix(lambda k: k == 4, 4, 1.0) == 0  # never the whole solution (n - 1)


def test_tree_minimal_prefixes_by_hand():
    # V = 3, H = 4. Problem 0: the oracle token at depth 1 is impossible (logit -60) and every later
    # one certain (+60), so guided success is 0 at k = 1 and 1 from k = 2 on: k* = 2 when the cap
    # allows 2 steps (0.5 x 4), none under a quarter (1 step). Problem 1: its last oracle token is
    # impossible, so no prefix (k <= 3) ever succeeds: k* = 0 at any cap. Problem 2: its first
    # oracle token is impossible, the rest certain: k* = 1 already.
    P = _problems()
    pol = pope.HabitTreePolicy(P.num_problems, 3, 4)
    with torch.no_grad():
        for d in range(4):
            for p, sign in ((0, -60.0 if d == 1 else 60.0), (1, -60.0 if d == 3 else 0.0),
                            (2, -60.0 if d == 0 else 60.0)):
                if d >= 1 or p == 2:
                    pol.u[d][p, :, P.oracle[p, d]] = sign
    g = torch.Generator().manual_seed(0)
    c = pope.POPEConfig(prefix_cap=0.5, probe_samples=32)
    assert pope.tree_minimal_prefixes(pol, P, [0, 1, 2], c, g) == {0: 2, 1: 0, 2: 1}
    c4 = pope.POPEConfig(prefix_cap=0.25, probe_samples=32)
    assert pope.tree_minimal_prefixes(pol, P, [0, 1, 2], c4, g) == {0: 0, 1: 0, 2: 1}
    c1 = pope.POPEConfig(prefix_cap=1.0, probe_samples=32)
    assert pope.tree_minimal_prefixes(pol, P, [1], c1, g) == {1: 0}


def test_guided_lengths_per_variant():
    rng = random.Random(0)
    ids, n = [4, 7, 9, 2], [6, 6, 6, 6]
    c = pope.POPEConfig(guidance="pope", guided_frac=0.5, schedule="anneal", prefix_start=0.5)
    assert pope.guided_lengths(ids, n, 0, 10, c, set(), rng) == [3, 3, 0, 0]
    m = pope.POPEConfig(guidance="pope", guided_frac=0.5)  # the paper's: fixed per problem
    pre = {4: 1, 7: 0, 9: 2, 2: 1}
    assert pope.guided_lengths(ids, n, 0, 10, m, set(), rng, pre) == [1, 0, 0, 0]
    assert pope.guided_lengths(ids[::-1], n, 9, 10, m, set(), rng, pre) == [1, 2, 0, 0]
    with pytest.raises(ValueError):
        pope.guided_lengths(ids, n, 0, 10, m, set(), rng)
    assert pope.guided_lengths(ids, n, 0, 10, pope.POPEConfig(guidance="none"), set(), rng) == [0] * 4
    g = pope.POPEConfig(guidance="guide", prefix_start=0.5)
    assert pope.guided_lengths(ids, n, 0, 10, g, {7, 2}, rng) == [0, 3, 0, 3]
    snap = pope.guided_lengths(ids * 50, n * 50, 0, 10, pope.POPEConfig(guidance="snapshot"),
                               set(), rng)
    assert set(snap) == set(range(6))


def test_habit_policy_start_and_oracles():
    P = _problems()
    assert P.oracle.shape == (5, 4)
    assert (P.oracle[:3] != 0).all()  # hard: off the habit at every depth
    assert ((P.oracle[3:] != 0).sum(-1) == 1).all()  # easy: at exactly one depth
    pol = pope.HabitTreePolicy(P.num_problems, 3, 4, p_habit=0.8)
    s = pope.unguided_success(pol, P)
    # hard: 0.1^4; easy: 0.8^3 * 0.1
    assert torch.allclose(s, torch.tensor([1e-4] * 3 + [0.0512] * 2, dtype=torch.float64))


def test_unguided_success_equals_token_tree_expected_reward():
    P = _problems(seed=3)
    pol = pope.HabitTreePolicy(P.num_problems, 3, 4)
    with torch.no_grad():
        for u in pol.u:
            u.normal_(generator=torch.Generator().manual_seed(1))
    probs = pol.probs()
    s = pope.unguided_success(pol, P)
    for p, tree in enumerate(P.trees):
        assert torch.isclose(s[p], tree.expected_reward([pd[p] for pd in probs]))


def test_forced_prefix_mask_and_rewards():
    P = _problems()
    pol = pope.HabitTreePolicy(P.num_problems, 3, 4)
    ids = torch.tensor([0, 0, 1, 1, 3, 3])
    k = torch.tensor([0, 2, 3, 4, 1, 4])
    g = torch.Generator().manual_seed(0)
    nodes, tokens, mask, old_logps, rewards = pope.sample_guided(pol, P, ids, k, g)
    for b in range(6):
        assert torch.equal(tokens[b, :k[b]], P.oracle[ids[b], :k[b]])
        assert mask[b].tolist() == [0.0] * int(k[b]) + [1.0] * (4 - int(k[b]))
    assert rewards[3] == 1.0 and rewards[5] == 1.0  # the whole oracle forced: a correct leaf
    # a prefix of 3 leaves one step: the reward rate is pi(oracle token | that node) = 0.05
    many = torch.full((4000,), 1)
    r = pope.sample_guided(pol, P, many, torch.full((4000,), 3), g)[4]
    assert abs(r.mean().item() - 0.075) < 0.015  # (1 - 0.85) / 2 with V = 3


def test_zero_reward_is_no_update_and_entropy_bonus_moves():
    P = _problems()
    cfg = GRPOConfig(num_iters=5, num_prompts=2, group_size=4, lr=0.1, num_epochs=2)
    pol, rows = pope.train_tree(P, cfg, pope.POPEConfig(guidance="none"), eval_every=5)
    # hard-only, success 1e-4 a sample, 40 samples: no reward, so every parameter stays put
    assert all(r.get("rollout/hard_reward", 0.0) == 0.0 for r in rows)
    assert rows[0]["eval/hard_success"] == rows[-1]["eval/hard_success"]
    pol2, rows2 = pope.train_tree(P, GRPOConfig(**{**cfg.__dict__, "entropy_coef": 0.1}),
                                  pope.POPEConfig(guidance="none"), eval_every=5)
    assert rows2[-1]["eval/hard_success"] > rows2[0]["eval/hard_success"]  # flatter: closer to 1/81


def test_tree_loss_by_hand():
    cfg = GRPOConfig(clip_eps=0.2, entropy_coef=0.5)
    logps = torch.log(torch.tensor([[0.5, 0.5], [0.2, 0.4]], dtype=torch.float64))
    old = logps.clone()
    adv = torch.tensor([1.0, -2.0], dtype=torch.float64)
    mask = torch.tensor([[0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    ents = torch.tensor([[9.0, 1.0], [2.0, 4.0]], dtype=torch.float64)
    loss, m = pope.tree_loss(logps, old, adv, mask, ents, cfg)
    # rho = 1: per-token loss -A; seq means: -1 and +2 -> 0.5; masked entropy mean (1+2+4)/3
    assert loss.item() == pytest.approx(0.5 - 0.5 * 7 / 3)
    assert m["clipfrac"] == 0.0


def test_guided_prompt_is_prompt_side(tiny_lm):
    model, tok = tiny_lm
    hard = make_problems("chain", 6, 4, "train", seed=0)
    cfg = GRPOConfig(num_prompts=4, group_size=2, max_new_tokens=4, num_iters=10)
    pc = pope.POPEConfig(guidance="pope", guided_frac=0.5, schedule="anneal", prefix_start=0.5,
                         prompt_form="prefill")
    sample = pope.guided_sampler(tok, hard, make_problems("chain", 4, 2, "train", seed=0),
                                 [lambda completions, **kw: [0.0] * len(completions)], cfg, pc)
    b = sample(model)
    assert b.seqs.completion_ids.shape[0] == 8
    assert b.metrics["rollout/guided_frac"] == 0.5
    texts = tok.batch_decode(b.seqs.prompt_ids, skip_special_tokens=False)
    guided = [t for t in texts if t.rstrip(tok.pad_token).endswith("\n") and "=" in t.split("assistant")[-1]]
    assert len(guided) == 4  # 2 guided prompts x G = 2, each ending in two oracle lines
    for t in guided:
        body = t.split("assistant\n")[-1].replace(tok.pad_token, "")
        assert body.count("\n") == 2
    p = hard[0]
    assert pope.guided_prompt("", p, 2) == "\n".join(reference_completion(p).split("\n")[:2]) + "\n"


def test_instruction_form_and_lm_prefix_search(tiny_lm):
    model, tok = tiny_lm
    hard = make_problems("chain", 4, 4, "train", seed=0)
    # the instruction form: the oracle lines and the instruction in the user turn, before the
    # assistant tag; k = 0 is the unguided prompt
    p = hard[0]
    lines = reference_completion(p).split("\n")
    q = pope.guided_prompts(tok, [p, p], [2, 0])
    assert q[1] == format_prompts(tok, [p])[0]
    head, tail = q[0].rsplit("assistant", 1)
    assert f"{p['prompt']}\n{lines[0]}\n{lines[1]}\n{pope.GUIDANCE_INSTRUCTION}" in head
    assert lines[2] not in q[0] and "=" not in tail  # nothing of the solution after the tag
    # the search, by hand: the reward says yes for problem 0 only, whatever the completion; with 4
    # steps and cap 0.5 it tries k = 1 for all 4 problems, then k = 2 for the 3 still unresolved
    calls = []

    def reward(completions, answer, **kw):
        calls.append(len(completions))
        return [float(a == hard[0]["answer"]) for a in answer]

    c = pope.POPEConfig(prefix_cap=0.5, probe_samples=3)
    ks = pope.lm_minimal_prefixes(model, tok, hard, [reward], c, max_new_tokens=2,
                                  generator=torch.Generator().manual_seed(0))
    others = [i for i in range(4) if hard[i]["answer"] == hard[0]["answer"]]
    assert ks == [1 if i in others else 0 for i in range(4)]
    assert calls == [4 * 3, (4 - len(others)) * 3]
    # the sampler puts each hard problem's own k in its guided rows
    cfg = GRPOConfig(num_prompts=4, group_size=2, max_new_tokens=2, num_iters=3)
    sample = pope.guided_sampler(tok, hard, [], [reward], cfg,
                                 pope.POPEConfig(guided_frac=1.0), prefixes=[2, 0, 1, 0])
    b = sample(model)
    texts = tok.batch_decode(b.seqs.prompt_ids, skip_special_tokens=True)
    assert sum(pope.GUIDANCE_INSTRUCTION in t for t in texts) == 4  # problems 0 and 2, G = 2
