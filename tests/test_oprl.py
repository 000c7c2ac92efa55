"""OPRL / iStar (algorithms/oprl.py): preference pairs, implicit step rewards, trajectory DPO,
step-level and combined advantages on hand-sized batches, and the PRM's first Adam step by hand."""

import math

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import agent_pg as apg
from agentrl_lib.algorithms import credit, oprl
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.models.policies import KeyTablePolicy
from agentrl_lib.rollout import Episode


def ep(keys, rewards, gid=0, actions=None):
    n = len(rewards)
    return Episode.of(keys, rewards, group_id=gid, action_ids=list(actions or [0] * n))


def test_preference_pairs_by_hand():
    batch = [ep(["s"], [1.0]), ep(["s"], [0.0]), ep(["s"], [0.5]),  # group 0: 3 distinct returns
             ep(["t"], [1.0], gid=1), ep(["t"], [1.0], gid=1),        # group 1: all equal
             ep(["u"], [1.0], gid=2)]                                 # group 2: one episode
    c, r = oprl.preference_pairs(batch)
    assert list(zip(c, r)) == [(0, 1), (0, 2), (2, 1)]
    c, r = oprl.preference_pairs(batch, "best_worst")
    assert list(zip(c, r)) == [(0, 1)]
    with pytest.raises(ValueError, match="pairs"):
        oprl.preference_pairs(batch, "some")


def test_implicit_step_rewards_by_hand():
    r = oprl.implicit_step_rewards([np.log([0.5, 0.25])], [np.log([0.25, 0.25])], beta=2.0)
    assert np.allclose(r[0], [2 * math.log(2), 0.0])


def test_trajectory_dpo_loss_by_hand():
    # 2 episodes, turns (0, 0, 1): sums log pi = (-1 - 2, -0.5), ref sums = (-2, -1)
    lp = torch.tensor([-1.0, -2.0, -0.5], dtype=torch.float64)
    ref = torch.tensor([-1.0, -1.0, -1.0], dtype=torch.float64)
    owner = torch.tensor([0, 0, 1])
    loss, m = oprl.trajectory_dpo_loss(lp, ref, owner, 2, torch.tensor([1]), torch.tensor([0]), beta=0.5)
    h = (-0.5 - -1.0) - (-3.0 - -2.0)  # chosen log-ratio - rejected log-ratio = 1.5
    assert loss.item() == pytest.approx(-math.log(1 / (1 + math.exp(-0.5 * h))))
    assert m["rewards/accuracies"] == 1.0


def test_step_level_advantages_by_hand():
    batch = [ep(["a", "b"], [0, 1]), ep(["c"], [0]),     # group 0: step rewards 1, 2 | 3
             ep(["d"], [1], gid=1),                        # group 1: one step
             ep(["e", "f"], [0, 0], gid=2), ep(["g"], [0], gid=2)]  # group 2: all equal
    r = [np.array([1.0, 2.0]), np.array([3.0]), np.array([5.0]), np.array([1.0, 1.0]), np.array([1.0])]
    a = oprl.step_level_advantages(batch, r)
    s = 1.0 + 1e-4  # std of (1, 2, 3) with ddof 1 is 1
    assert np.allclose(a[0], [-1 / s, 0.0]) and np.allclose(a[1], [1 / s])
    assert np.allclose(a[2], [0.0]) and np.allclose(a[3], [0, 0]) and np.allclose(a[4], [0])
    # gamma = 1: returns-to-go (3, 2 | 3): mean 8/3
    g = oprl.step_level_advantages(batch[:2], r[:2], gamma=1.0, norm_adv=False)
    assert np.allclose(g[0], [3 - 8 / 3, 2 - 8 / 3]) and np.allclose(g[1], [3 - 8 / 3])
    with pytest.raises(ValueError, match="length"):
        oprl.step_level_advantages(batch[:1], [np.zeros(3)])


def test_oprl_advantages_combine_episode_and_step():
    batch = [ep(["a", "b"], [0, 1]), ep(["c"], [0])]
    r = [np.array([1.0, 2.0]), np.array([3.0])]
    a = oprl.oprl_advantages(batch, r, alpha=0.5)
    a_e = credit.episode_advantages(batch)  # returns 1, 0: +-1/(sqrt(0.5) + eps)
    a_s = oprl.step_level_advantages(batch, r)
    assert np.allclose(a[0], a_e[0] + 0.5 * a_s[0]) and np.allclose(a[1], a_e[1] + 0.5 * a_s[1])
    assert a_e[0] == pytest.approx(0.5 / (math.sqrt(0.5) + 1e-4))
    # alpha = 0 is outcome-only GRPO
    z = oprl.oprl_advantages(batch, r, alpha=0.0)
    assert all(np.allclose(x, y) for x, y in zip(z, credit.grpo_broadcast(batch)))


def test_prm_first_adam_step_by_hand():
    # one pair from state s: action 0 won, action 1 lost; uniform reference over 4 actions.
    # dL/dtheta[s] = -beta/2 (e_0 - e_1) at the uniform start, and Adam's first step is
    # -lr * sign(grad): theta[s] = (lr, -lr, 0, 0)
    batch = [ep(["s"], [1.0], actions=[0]), ep(["s"], [0.0], actions=[1])]
    lr, beta = 0.3, 2.0
    prm = oprl.ImplicitPRM(4, oprl.OPRLConfig(beta=beta, lr=lr, num_epochs=1))
    fit = prm.fit(batch)
    assert torch.allclose(prm.theta[prm.rows["s"]], torch.tensor([lr, -lr, 0.0, 0.0], dtype=torch.float64),
                          atol=1e-6)
    logp = torch.log_softmax(torch.tensor([lr, -lr, 0.0, 0.0], dtype=torch.float64), -1).numpy()
    r = prm.step_rewards(batch)
    assert np.allclose(r[0], beta * (logp[0] + math.log(4))) and np.allclose(r[1], beta * (logp[1] + math.log(4)))
    h = beta * (logp[0] - logp[1])
    assert fit["dpo_loss"] == pytest.approx(-math.log(1 / (1 + math.exp(-h))))
    assert fit["pair_accuracy"] == 1.0 and fit["num_pairs"] == 1


def test_prm_fit_orders_trajectories_and_credits_the_deciding_step():
    # two steps; the first is shared (same key, same action), the second decides the outcome
    batch = [ep(["s", "x"], [0, 1], actions=[0, 2]), ep(["s", "x"], [0, 0], actions=[0, 3]),
             ep(["s", "x"], [0, 1], actions=[0, 2]), ep(["s", "x"], [0, 0], actions=[0, 3])]
    prm = oprl.ImplicitPRM(4, oprl.OPRLConfig(num_epochs=50, lr=0.1))
    fit = prm.fit(batch)
    r = prm.step_rewards(batch)
    sums = [x.sum() for x in r]
    assert sums[0] > sums[1] and fit["pair_accuracy"] == 1.0
    assert r[0][1] > 0 > r[1][1]  # the deciding step is credited, either sign
    a = oprl.oprl_advantages(batch, r)
    assert a[0][1] > a[0][0] and a[1][1] < a[1][0]  # within an episode, the step term moves the credit


def test_no_pairs_and_errors():
    same = [ep(["s"], [1.0]), ep(["s"], [1.0])]
    prm = oprl.ImplicitPRM(4)
    fit = prm.fit(same)
    assert fit["num_pairs"] == 0 and math.isnan(fit["dpo_loss"])
    assert all(np.allclose(x, 0) for x in prm.step_rewards(same))
    free_text = Episode.of(["s"], [1.0])  # no action_ids
    with pytest.raises(ValueError, match="action_index"):
        prm.fit([free_text])
    with pytest.raises(ValueError, match="ref_logps"):
        prm.step_rewards(same, ref_logps=[np.zeros(2), np.zeros(1)])
    with pytest.raises(ValueError, match="outside"):
        oprl.ImplicitPRM(2).fit([ep(["s"], [1.0], actions=[3])])
    with pytest.raises(ValueError, match="gamma"):
        oprl.OPRLConfig(gamma=2.0)
    lm_like = oprl.ImplicitPRM(3, action_index=lambda e, t: 2)  # the spare index for free text
    assert lm_like.logps([free_text])[0] == pytest.approx([-math.log(3)])


def test_credit_with_policy_reference_starts_at_zero_step_rewards():
    # ref = pi_old and new PRM rows start at the policy's logits: before any DPO step every
    # step reward is 0 and OPRL is outcome-only GRPO
    env = GridAgentEnv(max_turns=6)
    pol = KeyTablePolicy(len(env.actions), seed=0)
    with torch.no_grad():
        pol.logits.normal_(generator=torch.Generator().manual_seed(0))
    from agentrl_lib.rollout import play_episodes
    batch = play_episodes(lambda: GridAgentEnv(max_turns=6), pol.act, [0, 1], 4)
    cr = oprl.OPRLCredit(oprl.ImplicitPRM(4, oprl.OPRLConfig(num_epochs=0)), ref="policy", policy=pol)
    adv = cr(batch)
    assert all(np.allclose(x, 0, atol=1e-12) for x in cr.last_step_rewards)
    assert all(np.allclose(x, y) for x, y in zip(adv, credit.grpo_broadcast(batch)))
    with pytest.raises(ValueError, match="policy"):
        oprl.OPRLCredit(oprl.ImplicitPRM(4), ref="policy")


def test_batch_entry_and_training_loop():
    make = lambda: GridAgentEnv(max_turns=8)  # noqa: E731
    pol = KeyTablePolicy(4, seed=0)
    with torch.no_grad():
        pol.logits.normal_(generator=torch.Generator().manual_seed(1))
    from agentrl_lib.rollout import play_episodes
    batch = play_episodes(make, pol.act, [0, 1, 2, 3], 4)
    adv = oprl.oprl_batch_advantages(batch, 4, num_epochs=10, ref_logps=oprl.policy_ref_logps(pol, batch))
    assert [len(a) for a in adv] == [len(e) for e in batch]
    assert all(np.isfinite(a).all() for a in adv)
    # with policy= and no DPO step, every step reward is 0: OPRL is GRPO
    zero = oprl.oprl_batch_advantages(batch, 4, num_epochs=0, policy=pol)
    assert all(np.allclose(x, y) for x, y in zip(zero, credit.grpo_broadcast(batch)))
    with pytest.raises(ValueError, match="not both"):
        oprl.oprl_batch_advantages(batch, 4, policy=pol, ref_logps=oprl.policy_ref_logps(pol, batch))
    cr = oprl.OPRLCredit(oprl.ImplicitPRM(4, oprl.OPRLConfig(num_epochs=5)))
    hist = apg.train(make, pol, apg.AgentPGConfig(num_iters=2, num_prompts=2, group_size=4, eval_every=5),
                     list(range(20)), credit_fn=cr)
    assert len(hist) == 2 and len(cr.metrics) == 2 and pol.logits.abs().sum().item() > 0
