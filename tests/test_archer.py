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


def test_episode_transitions_reads_the_parsed_action_of_lm_episodes():
    # LM episodes carry no action_ids: the env's parsed index (info["action"]) is used, and a
    # malformed turn (action None) goes to the extra column
    ep = Episode.of(["a", "b"], [0.0, 1.0], valid=[False, True], next_state_key="c",
                    infos=[{"action": None}, {"action": 3}])
    assert archer.episode_transitions(ep, 5) == [("a", 5, 0.0, "b", 0.0), ("b", 3, 1.0, "c", 1.0)]


def _mlp_by_hand(D, out, hidden):
    return torch.nn.Sequential(torch.nn.Linear(D, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                               torch.nn.Linear(hidden, out))


def test_key_critic_is_twin_mlp_heads_over_key_features():
    env = TwentyQuestionsEnv(items=["dog", "eagle", "car", "airplane"], max_turns=3)
    A, D = len(env.actions), env.num_items + env.max_turns + 1
    torch.manual_seed(0)
    critic = archer.key_critic(env, ArcherConfig(hidden=16))
    torch.manual_seed(0)  # the same draws, in the same order: q head, then v head
    q_head, v_head = _mlp_by_hand(D, 2 * (A + 1), 16), _mlp_by_hand(D, 2, 16)
    keys = [env.start_key(), ((0, 2), 1), ((3,), 2)]
    x = torch.tensor(np.stack([env.key_features(k) for k in keys]))  # (B, D)
    q, v = critic.net(keys)  # (B, E, A+1), (B, E)
    torch.testing.assert_close(q, q_head(x).view(3, 2, A + 1))
    torch.testing.assert_close(v, v_head(x))
    # the target starts equal, frozen
    qt, vt = critic.target(keys)
    torch.testing.assert_close((qt, vt), (q, v))
    assert not any(p.requires_grad for p in critic.target.parameters())


def test_key_critic_lives_on_the_host_under_another_default_device():
    env = TwentyQuestionsEnv(items=["dog", "eagle", "car", "airplane"], max_turns=3)
    with torch.device("meta"):
        critic = archer.key_critic(env, ArcherConfig(hidden=8, batch_size=4))
        ep = Episode.of([env.start_key()], [1.0], next_state_key=((0,), 1),
                        infos=[{"action": 3}])
        critic.add([ep])
        critic.update(2)
        adv = archer.archer_advantages([ep], critic)
    assert critic.net.device.type == "cpu" and adv[0].shape == (1,)


def test_lm_credit_fn_fills_the_buffer_fits_and_returns_turn_advantages():
    env = TwentyQuestionsEnv(items=["dog", "eagle", "car", "airplane"], max_turns=3)
    cfg = ArcherConfig(hidden=16, batch_size=8, critic_lr=1e-2, bootstrap_truncated=False)
    torch.manual_seed(0)
    critic = archer.key_critic(env, cfg)
    fn = archer.lm_credit_fn(critic, critic_updates=3)
    s0, s1 = env.start_key(), ((0, 2), 1)
    eps = [Episode.of([s0, s1], [0.0, 1.0], next_state_key=((0,), 2),
                      infos=[{"action": 0}, {"action": 3}]),
           Episode.of([s0], [0.0], valid=[False], next_state_key=(s0[0], 1), truncated=True,
                      infos=[{"action": None}])]
    before = [p.clone() for p in critic.net.parameters()]
    adv = fn(eps)
    assert len(critic.buffer) == 3 and len(fn.metrics) == 1 and "q_loss" in fn.metrics[0]
    assert any(not torch.equal(a, b) for a, b in zip(before, critic.net.parameters()))
    assert [a.shape for a in adv] == [(2,), (1,)]
    # the advantages are min Q - min V of the critic *after* the update, at the logged actions
    q, v = critic.net([s0, s1, s0])
    direct = [q[0, :, 0].min() - v[0].min(), q[1, :, 3].min() - v[1].min(),
              q[2, :, len(env.actions)].min() - v[2].min()]
    assert np.allclose(np.concatenate(adv), [d.item() for d in direct], atol=1e-6)
    fn(eps)
    assert len(critic.buffer) == 6 and len(fn.metrics) == 2


def test_tq_agent_base_is_a_noisy_expert_on_a_solvable_game():
    from agentrl_lib.algorithms.sft import BASE_MODELS, TQ_AGENT_GAME

    cfg = BASE_MODELS["tq-agent-tiny"]
    assert cfg.env == "twenty_questions" and cfg.env_kwargs == TQ_AGENT_GAME
    assert cfg.system_prompt == TwentyQuestionsEnv.system_prompt
    env = TwentyQuestionsEnv(**cfg.env_kwargs)
    env.reset(seed=0)
    A = len(env.actions)
    v_star, q_star = env.optimal_values()
    assert v_star(env.start_key()) == pytest.approx(1.0)  # two questions identify the item

    def noisy(k):
        best = (q_star(k) >= q_star(k).max() - 1e-9).astype(float)
        return (1 - cfg.epsilon) * best / best.sum() + cfg.epsilon / A

    # the documented success of the demonstrator (sft.BASE_MODELS comment): room for RL
    assert env.success_probability(noisy) == pytest.approx(0.583, abs=1e-3)
    assert env.success_probability(lambda k: np.ones(A) / A) == pytest.approx(0.370, abs=1e-3)


def test_replay_buffer_keeps_each_turns_context_and_draws_as_sample():
    buf = archer.ReplayBuffer(capacity=3)
    buf.add([("a", 0, 0.0, "b", 0.0), ("b", 1, 1.0, "c", 1.0)], [[1, 2], [1, 2, 3]])
    buf.add([("x", 2, 0.0, "y", 1.0), ("y", 0, 0.0, "z", 1.0)])  # no contexts: None; drops "a"
    assert [t[0] for t in buf.data] == ["b", "x", "y"] and list(buf.contexts) == [[1, 2, 3],
                                                                                   None, None]
    tr, ctx = buf.sample_with_contexts(6, np.random.default_rng(5))
    assert tr == buf.sample(6, np.random.default_rng(5))
    assert all(c == ([1, 2, 3] if t[0] == "b" else None) for t, c in zip(tr, ctx))


def test_turn_contexts_are_the_tokens_before_each_action():
    ep = Episode.of(["s0", "s1"], [0.0, 1.0])
    assert archer.turn_contexts(ep) == [None, None]
    ep.prompt_ids, ep.token_ids, ep.turn_spans = [7, 8], [1, 2, 3, 4, 5, 6], [(0, 2), (4, 6)]
    assert archer.turn_contexts(ep) == [[7, 8], [7, 8, 1, 2, 3, 4]]


def test_v_term_on_fresh_actions_is_the_reference_critic_loss_by_hand():
    # the reference's critic_loss: V_e(s) regressed on Q_e^targ(s, a_pi) of the given fresh
    # actions (here of a pool of two states), Q_e(s, a) on r + gamma (1 - d) V_e^targ(s')
    cfg = ArcherConfig(gamma=0.5, num_critics=2)
    critic = archer.ArcherCritic(2, cfg)
    with torch.no_grad():  # the online table; the target keeps its own numbers
        for key, q_row, v_row in [("s", [1.0, 0.0, 0.0, 0.5, 2.0, 0.0], [0.2, 0.4]),
                                  ("t", [0.0, 3.0, 0.0, 0.0, 1.0, 0.0], [1.0, 0.0])]:
            r = critic.net.features.row(key)
            critic.net.q_head.weight[r] = torch.tensor(q_row)
            critic.net.v_head.weight[r] = torch.tensor(v_row)
        critic.target.load_state_dict(critic.net.state_dict())
    batch = [("s", 0, 1.0, "t", 0.0)]  # y_e = 1 + 0.5 V_e^targ(t) = (1.5, 1.0); Q_e(s,0)=(1, .5)
    loss, m = critic.loss(batch, v_batch=(["s", "t"], [1, 1]))
    # V term: states s, t with a_pi = 1: targets Q^targ(s,1) = (0, 2), Q^targ(t,1) = (3, 1);
    # V(s) = (.2, .4), V(t) = (1, 0): mean over the pool, summed over members
    v_hand = ((0.2 - 0) ** 2 + (1 - 3) ** 2) / 2 + ((0.4 - 2) ** 2 + (0 - 1) ** 2) / 2
    q_hand = (1 - 1.5) ** 2 + (0.5 - 1.0) ** 2
    assert m["v_loss"] == pytest.approx(v_hand) and m["q_loss"] == pytest.approx(q_hand)
    assert loss.item() == pytest.approx(v_hand + q_hand)
    # without a pool, the logged action's Q^targ(s, 0) = (1, .5) is V(s)'s target
    _, m_logged = critic.loss(batch)
    assert m_logged["v_loss"] == pytest.approx((0.2 - 1) ** 2 + (0.4 - 0.5) ** 2)


def test_turn_logps_is_the_sum_of_the_actions_token_logprobs(tiny_lm):
    # the reference's get_log_prob: sum over the action tokens of log softmax, by a plain
    # forward pass of each (context + action) alone
    model, tok = tiny_lm
    contexts, actions = [[5, 6, 7, 8], [9, 10]], [[11, 12], [13, 14, 15]]
    lp = archer.turn_logps(model, contexts, actions, tok.pad_token_id)
    for c, a, got in zip(contexts, actions, lp):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([c + a])).logits[0]  # (L, V)
        logp = torch.log_softmax(logits.float(), -1)
        hand = sum(logp[len(c) - 1 + k, t] for k, t in enumerate(a))
        assert got.item() == pytest.approx(hand.item(), abs=1e-4)
    assert lp.requires_grad


def _lm_setup(tiny_lm, cfg):
    model, tok = tiny_lm
    env = TwentyQuestionsEnv(items=["dog", "eagle", "car", "airplane"], max_turns=3)
    from agentrl_lib.rollout import lm_rollout

    eps = lm_rollout(model, tok, lambda: TwentyQuestionsEnv(
        items=["dog", "eagle", "car", "airplane"], max_turns=3), [0, 1], 2, 3, 4,
        generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    critic = archer.key_critic(env, cfg, np.random.default_rng(0))
    critic.add(eps)
    return model, tok, env, critic, eps


def test_lm_actor_step_is_reinforce_on_replayed_states_with_fresh_actions(tiny_lm):
    import copy

    cfg = ArcherConfig(hidden=8, batch_size=4, actor_batch_size=3, actor_lr=1e-2,
                       max_grad_norm=None, seed=0)
    model, tok, env, critic, _ = _lm_setup(tiny_lm, cfg)
    model = copy.deepcopy(model)
    parse = lambda t: env.parse(t)[0]  # noqa: E731
    start = copy.deepcopy(model)
    # by hand: the same replay draw and token draws, A from the critic, -mean(log pi A), SGD
    rng_state = copy.deepcopy(critic.rng)
    batch, ctx = critic.buffer.sample_with_contexts(3, rng_state)
    rows, cols = archer.fresh_actions(model, tok, ctx, parse, critic.num_actions, 4, 1.0,
                                      torch.Generator().manual_seed(9))
    adv = critic.advantages([t[0] for t in batch], cols)
    logps = archer.turn_logps(start, ctx, rows, tok.pad_token_id)
    hand_loss = -(logps * adv).mean()
    opt = torch.optim.SGD(model.parameters(), lr=cfg.actor_lr)
    m = archer.lm_actor_step(model, tok, critic, opt, cfg, parse, 4, 1.0,
                             torch.Generator().manual_seed(9))
    assert m["actor_loss"] == pytest.approx(hand_loss.item(), abs=1e-5)
    hand_loss.backward()
    for p0, p1 in zip(start.parameters(), model.parameters()):  # one SGD step: p - lr grad
        expected = p0 - cfg.actor_lr * (p0.grad if p0.grad is not None else 0)
        torch.testing.assert_close(p1, expected, atol=1e-6, rtol=1e-5)
    assert 0.0 <= m["fresh_invalid"] <= 1.0


def test_lm_train_warms_up_the_critic_then_trains_the_actor_on_replay(tiny_lm):
    import copy

    from agentrl_lib.algorithms.grpo import GRPOConfig, episode_sampler

    cfg = ArcherConfig(num_iters=3, hidden=8, batch_size=4, critic_updates=2, actor_updates=2,
                       actor_batch_size=3, v_samples=4, warmup_iters=1, actor_lr=1e-2,
                       bootstrap_truncated=False, seed=0)
    model, tok, env, critic, _ = _lm_setup(tiny_lm, cfg)
    model = copy.deepcopy(model)
    critic = archer.key_critic(env, cfg, np.random.default_rng(0))
    make = lambda: TwentyQuestionsEnv(items=["dog", "eagle", "car", "airplane"],  # noqa: E731
                                      max_turns=3)
    gcfg = GRPOConfig(num_prompts=2, group_size=2, max_turns=3, max_new_tokens=4, seed=0)
    before = [p.clone() for p in model.parameters()]
    rows = archer.lm_train(model, tok, episode_sampler(tok, make, list(range(50)), gcfg), critic,
                           cfg, lambda t: env.parse(t)[0], 4)
    assert [r["iter"] for r in rows] == [1, 2, 3]
    assert "losses/actor_loss" not in rows[0] and "losses/v_loss" in rows[0]  # warm-up
    assert all("losses/actor_loss" in r for r in rows[1:])
    assert len(critic.buffer) == sum(r["rollout/turns"] * 4 for r in rows)
    assert all(c is not None for c in critic.buffer.contexts)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
