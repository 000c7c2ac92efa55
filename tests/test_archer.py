"""ArCHer's turn critic and actor: hand-computed targets, soft update, advantage shape and sign."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import archer
from agentrl_lib.algorithms.archer import ArcherConfig
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.envs.twenty_questions import TwentyQuestionsEnv
from agentrl_lib.models.policies import KeyTablePolicy, tabular_agent
from agentrl_lib.rollout import Episode, play_episodes


def test_td_and_v_targets_by_hand():
    y = archer.td_targets(torch.tensor([0.0, 1.0, -0.1]), torch.tensor([0.0, 1.0, 0.0]),
                          torch.tensor([[0.5, 0.2], [0.7, 0.7], [1.0, 0.0]]), 0.9)
    assert torch.allclose(y, torch.tensor([[0.45, 0.18], [1.0, 1.0], [0.8, -0.1]]))
    q = torch.tensor([[[0.2, 0.6, 5.0], [1.0, 0.0, 5.0]]])  # (B=1, E=2, A+1=3)
    assert torch.allclose(archer.v_targets(q, torch.tensor([[0.25, 0.75]])),
                          torch.tensor([[0.5, 0.25]]))
    assert torch.allclose(archer.v_targets(q, None, torch.tensor([2])), torch.tensor([[5.0, 5.0]]))


def test_soft_update_by_hand():
    online, target = torch.nn.Linear(2, 1), torch.nn.Linear(2, 1)
    with torch.no_grad():
        for p in online.parameters():
            p.fill_(1.0)
        for p in target.parameters():
            p.fill_(-1.0)
    archer.soft_update(target, online, 0.25)  # -1 * 0.75 + 1 * 0.25 = -0.5
    assert all(torch.allclose(p, torch.full_like(p, -0.5)) for p in target.parameters())
    archer.soft_update(target, online, 1.0)
    assert all(torch.allclose(p, torch.ones_like(p)) for p in target.parameters())


def test_advantage_takes_the_min_over_members_and_actor_loss_sign():
    q = torch.tensor([[[0.6, 0.1], [0.4, 0.9]]])  # (B, E, A+1)
    v = torch.tensor([[0.5, 0.45]])
    assert torch.allclose(archer.advantages_from_critic(q, v, torch.tensor([0])),
                          torch.tensor([-0.05]))
    assert torch.allclose(archer.advantages_from_critic(q, v, torch.tensor([1])),
                          torch.tensor([0.1 - 0.45]))
    logps = torch.tensor([-1.0, -2.0], requires_grad=True)
    loss, m = archer.actor_loss(logps, torch.tensor([1.0, -1.0]))
    loss.backward()
    assert loss.item() == pytest.approx(-(-1.0 * 1 + -2.0 * -1) / 2)
    assert logps.grad.tolist() == [-0.5, 0.5]  # descent raises log pi where A > 0


def _episode(keys, actions, rewards, next_key, truncated, valid=None):
    return Episode.of(keys, rewards, valid=valid or [True] * len(actions), next_state_key=next_key,
                      truncated=truncated, action_ids=actions)


def test_episode_transitions_done_flags_and_malformed_column():
    ep = _episode(["a", "b"], [1, None], [0.0, 1.0], "c", truncated=False, valid=[True, False])
    tr = archer.episode_transitions(ep, num_actions=4)
    assert tr == [("a", 1, 0.0, "b", 0.0), ("b", 4, 1.0, "c", 1.0)]
    cut = _episode(["a"], [2], [0.0], "b", truncated=True)
    assert archer.episode_transitions(cut, 4)[0][4] == 0.0  # bootstrap the capped state
    assert archer.episode_transitions(cut, 4, bootstrap_truncated=False)[0][4] == 1.0


def test_tabular_critic_converges_to_the_td_fixed_point():
    # two-turn chain: s0 -a0-> s1 -a1-> end with reward 1; gamma 0.9: Q(s1,a1) = 1, Q(s0,a0) = 0.9
    ep = _episode(["s0", "s1"], [0, 1], [0.0, 1.0], "end", truncated=False)
    cfg = ArcherConfig(gamma=0.9, tau=0.5, critic_lr=0.1, batch_size=8, num_critics=2, seed=0)
    critic = archer.fit_critic([ep], num_actions=2, cfg=cfg, num_steps=600)
    q, v = critic.values(["s0", "s1"])
    assert q[0, 0].item() == pytest.approx(0.9, abs=0.02)
    assert q[1, 1].item() == pytest.approx(1.0, abs=0.02)
    assert v.tolist() == pytest.approx([0.9, 1.0], abs=0.02)  # logged-action V target
    adv = archer.archer_advantages([ep], critic)
    assert len(adv) == 1 and adv[0].shape == (2,) and np.allclose(adv[0], 0.0, atol=0.03)


def test_advantage_sign_on_the_grid_matches_exact_a_pi():
    # one task; uniform behaviour; the critic's advantage must have the sign of exact A^pi
    # on well-visited (state, action) pairs
    env = GridAgentEnv(layout=["...", "...", "..."], tasks=[((0, 0), (0, 2))], max_turns=6,
                       gamma=0.9)
    A = len(env.actions)
    rng = np.random.default_rng(0)
    eps = play_episodes(lambda: GridAgentEnv(layout=["...", "...", "..."],
                                             tasks=[((0, 0), (0, 2))], max_turns=6, gamma=0.9),
                        tabular_agent(np.ones((1, A)) / A, lambda e: 0, rng), list(range(300)))
    cfg = ArcherConfig(gamma=0.9, critic_lr=0.02, batch_size=64, seed=0)
    critic = archer.fit_critic(eps, A, cfg, num_steps=1200,
                               policy_probs=lambda ks: torch.full((len(ks), A), 1.0 / A))
    adv = archer.archer_advantages(eps, critic)
    assert [a.shape for a in adv] == [(len(ep),) for ep in eps]
    # at the start (0,0) with the goal two cells right: "right" is good, "left"/"up" bump walls
    start = eps[0].state_keys[0]
    q, v = critic.values([start])
    right, left = env.actions.index("right"), env.actions.index("left")
    assert q[0, right] - v[0] > 0.05 and q[0, left] - v[0] < 0


def test_actor_step_raises_the_probability_of_a_positive_advantage_action():
    cfg = ArcherConfig(batch_size=16, actor_lr=0.1, seed=0)
    critic = archer.ArcherCritic(2, cfg)
    with torch.no_grad():  # hand-set table: Q(s, 0) = 1, Q(s, 1) = 0, V(s) = 0.5
        row = critic.net.features.row("s")
        critic.net.q_head.weight[row] = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0])
        critic.net.v_head.weight[row] = torch.tensor([0.5, 0.5])
    critic.buffer.add([("s", 0, 0.0, "t", 1.0)])
    policy = KeyTablePolicy(2, capacity=4)
    before = policy.probs(["s"])[0, 0].item()
    opt = torch.optim.Adam(policy.parameters(), lr=cfg.actor_lr)
    for _ in range(5):
        archer.actor_step(policy, critic, opt, cfg, np.random.default_rng(0))
    assert before == pytest.approx(0.5) and policy.probs(["s"])[0, 0].item() > 0.6


def test_token_advantages_spread_the_turn_value():
    ep = _episode(["s0", "s1"], [0, 1], [0.0, 1.0], "end", truncated=False)
    ep.token_ids, ep.turn_spans = list(range(7)), [(0, 2), (4, 7)]
    critic = archer.ArcherCritic(2, ArcherConfig())
    with torch.no_grad():
        critic.net.q_head.weight[critic.net.features.row("s0")] = 0.3  # A(s0, .) = 0.3
    tok = archer.token_advantages([ep], critic)[0]
    assert tok.tolist() == pytest.approx([0.3, 0.3, 0, 0, 0, 0, 0])


def test_train_runs_and_learns_on_twenty_questions():
    make_env = lambda: TwentyQuestionsEnv(max_turns=5)  # noqa: E731
    env = make_env()
    A = len(env.actions)
    policy = KeyTablePolicy(A, capacity=4096, seed=0)
    uniform = env.success_probability(lambda k: np.ones(A) / A)
    cfg = ArcherConfig(num_iters=15, episodes_per_iter=16, critic_lr=0.02, actor_lr=0.03,
                       critic_updates=20, actor_updates=20, bootstrap_truncated=False, seed=0)
    hist, critic = archer.train(make_env, policy, cfg, list(range(1000)))
    assert hist[-1]["episodes"] == 15 * 16 and len(critic.buffer) > 15 * 16
    with torch.no_grad():
        learned = env.success_probability(lambda k: policy.probs([k]).numpy()[0])
    assert learned > uniform + 0.05
