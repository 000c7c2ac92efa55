"""POPE (agentrl_lib.algorithms.pope): the schedule, the tree's exact success against TokenTreeMDP,
forced prefixes and their mask, zero reward = no update, and the LM sampler's prompt-side prefix."""

import random

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import pope
from agentrl_lib.algorithms.grpo import GRPOConfig
from agentrl_lib.envs.text_tasks import make_problems, reference_completion


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


def test_guided_lengths_per_variant():
    rng = random.Random(0)
    ids, n = [4, 7, 9, 2], [6, 6, 6, 6]
    c = pope.POPEConfig(guidance="pope", guided_frac=0.5, prefix_start=0.5)
    assert pope.guided_lengths(ids, n, 0, 10, c, set(), rng) == [3, 3, 0, 0]
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
    pc = pope.POPEConfig(guidance="pope", guided_frac=0.5, prefix_start=0.5)
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
