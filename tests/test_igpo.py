"""IGPO: information-gain turn rewards, joint group normalisation, the p(gold | h) helpers
(TwentyQuestions, GridAgentEnv, LM) and the InfoPO / E-GRPO cells."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import igpo
from agentrl_lib.algorithms.credit import grpo_broadcast
from agentrl_lib.envs.multiturn import GridAgentEnv
from agentrl_lib.envs.twenty_questions import TwentyQuestionsEnv
from agentrl_lib.rollout import Episode, play_episodes


def ep(T, R, group_id=0, keys=None):
    return Episode.of(keys or [f"s{t}" for t in range(T)], [0.0] * (T - 1) + [R], group_id)


def test_hand_computed_two_episodes():
    # A: p = (1/4, 1/2, 1), R = 1 -> r = (IG_0, R) = (1/4, 1); B: one turn, R = 0 -> r = (0,)
    # group mean 5/12; centred (-1/6, 7/12 | -5/12); gamma 1/2: A_A = (-1/6 + 7/24, 7/12) = (1/8, 7/12)
    eps = [ep(2, 1.0), ep(1, 0.0)]
    p = [[0.25, 0.5, 1.0], [0.25, 0.25]]
    assert np.allclose(igpo.info_gain_rewards(eps, p)[0], [0.25, 0.5])
    r = igpo.igpo_turn_rewards(eps, p)
    assert np.allclose(r[0], [0.25, 1.0]) and np.allclose(r[1], [0.0])
    a = igpo.igpo_advantages(eps, p, gamma=0.5, norm_adv=False)
    assert np.allclose(a[0], [1 / 8, 7 / 12]) and np.allclose(a[1], [-5 / 12])
    # normalised: divided by the sample std (ddof=1) of (1/4, 1, 0) plus eps
    std = np.std([0.25, 1.0, 0.0], ddof=1)
    a = igpo.igpo_advantages(eps, p, gamma=0.5)
    assert np.allclose(a[1], [-5 / 12 / (std + 1e-4)])
    # the "sum" variant adds the last turn's information gain to R: r_A = (1/4, 1 + 1/2)
    assert np.allclose(igpo.igpo_turn_rewards(eps, p, last_turn="sum")[0], [0.25, 1.5])
    assert np.allclose(igpo.igpo_turn_rewards(eps, p, ig_weight=2.0)[0], [0.5, 1.0])


def test_equals_an_independent_padded_implementation():
    rng = np.random.default_rng(0)
    eps, p = [], []
    for g in range(3):
        for _ in range(4):
            T = int(rng.integers(1, 6))
            eps.append(ep(T, float(rng.integers(2)), group_id=g))
            p.append(rng.random(T + 1))
    gamma = 0.9
    ours = igpo.igpo_advantages(eps, p, gamma=gamma)
    B, Tmax = len(eps), max(len(e) for e in eps)
    r = np.zeros((B, Tmax))
    mask = np.zeros((B, Tmax), dtype=bool)
    for i, (e, pi) in enumerate(zip(eps, p)):
        T = len(e)
        r[i, :T] = np.diff(pi)
        r[i, T - 1] = e.ret
        mask[i, :T] = True
    gid = np.array([e.group_id for e in eps])
    z = np.zeros_like(r)
    for g in set(gid):
        m = mask & (gid[:, None] == g)
        vals = r[m]
        z[m] = (vals - vals.mean()) / (vals.std(ddof=1) + 1e-4)
    disc = gamma ** (np.arange(Tmax)[None, :] - np.arange(Tmax)[:, None])  # (T, T): gamma^(k - t)
    want = (z[:, None, :] * np.triu(disc)[None]).sum(-1)  # (B, T)
    for i, e in enumerate(eps):
        assert np.allclose(ours[i], want[i, :len(e)])


def test_edge_cases_zero_signal_and_bad_input():
    # a group of one one-turn episode: a single reward -> 0
    assert np.allclose(igpo.igpo_advantages([ep(1, 1.0)], [[0.2, 0.9]])[0], [0.0])
    # all turn rewards equal (no information gained, equal outcomes) -> exactly 0
    eps = [ep(1, 0.0), ep(1, 0.0)]
    assert all(np.all(a == 0) for a in igpo.igpo_advantages(eps, [[0.5, 0.5], [0.1, 0.1]]))
    with pytest.raises(ValueError, match="p_gold\\[1\\] has length 3"):
        igpo.igpo_advantages(eps, [[0.5, 0.5], [0.1, 0.2, 0.3]])
    with pytest.raises(ValueError, match="last_turn"):
        igpo.igpo_turn_rewards(eps, [[0.5, 0.5], [0.1, 0.1]], last_turn="last")
    with pytest.raises(ValueError, match="2 episodes"):
        igpo.igpo_advantages(eps, [[0.5, 0.5]])


def test_zero_variance_groups_outcome_vs_information_gain():
    # group 0: both fail, but one episode raised p(gold); group 1: one success, one failure
    eps = [ep(2, 0.0, 0), ep(2, 0.0, 0), ep(1, 1.0, 1), ep(1, 0.0, 1)]
    p = [[0.25, 0.5, 0.5], [0.25, 0.25, 0.25], [0.25, 1.0], [0.25, 0.5]]
    assert igpo.zero_variance_share(eps) == 0.5
    assert igpo.zero_variance_share(eps, grpo_broadcast(eps)) == 0.5
    assert igpo.zero_variance_share(eps, igpo.igpo_advantages(eps, p)) == 0.0
    assert igpo.zero_variance_share([]) == 0.0


def test_tq_p_gold_posterior_and_policy_head():
    env = TwentyQuestionsEnv(items=["dog", "eagle", "car", "airplane"],
                             attributes=["alive", "able to fly", "edible"], max_turns=4)

    def scripted(actions):
        def act(envs, observations):
            return [env.actions.index(actions[e.turn]) for e in envs]
        return act

    # hidden item drawn by seed; ask alive, able to fly, then guess each item until right
    eps = play_episodes(lambda: TwentyQuestionsEnv(items=env.items, attributes=env.attributes,
                                                   max_turns=4),
                        scripted(["Is it alive?", "Is it able to fly?", "Is it a dog?", "Is it an eagle?"]),
                        [0, 1, 2, 3], 1)
    for e in eps:
        p = igpo.tq_p_gold([e], env, "posterior")[0]
        sizes = [len(b) for b, _ in list(e.state_keys) + [e.next_state_key]]
        want = [1 / s for s in sizes]
        if e.success:  # after the correct guess p(gold) = 1
            want[-1] = 1.0
        assert np.allclose(p, want)
        assert np.allclose(p[:3], [1 / 4, 1 / 2, 1.0])  # two questions identify the item
    uniform = lambda keys: np.full((len(keys), len(env.actions)), 1 / len(env.actions))  # noqa: E731
    assert np.allclose(igpo.tq_p_gold(eps, env, "policy", uniform)[0], 0.25)

    def likes_dog(keys):  # guesses dog with 3x the weight of the other items
        p = np.ones((len(keys), len(env.actions)))
        p[:, env.num_questions] = 3.0
        return p / p.sum(-1, keepdims=True)
    for e in eps:  # 3/6 for a hidden dog, 1/6 for any other item
        want = 0.5 if e.task == "dog" else 1 / 6
        assert np.allclose(igpo.tq_p_gold([e], env, "policy", likes_dog)[0], want)
    with pytest.raises(ValueError, match="probs_fn"):
        igpo.tq_p_gold(eps, env, "policy")
    with pytest.raises(ValueError, match="head"):
        igpo.tq_p_gold(eps, env, "oracle")


def test_grid_p_gold_expert_path_probability():
    # 2x2 open grid, goal (1, 1): two shortest paths from (0, 0)
    env = GridAgentEnv(layout=["..", ".."], tasks=[((0, 0), (1, 1))], max_turns=4)

    def probs(keys):  # pi(up, down, left, right) = (0.1, 0.2, 0.3, 0.4) everywhere
        return np.tile([0.1, 0.2, 0.3, 0.4], (len(keys), 1))
    q = igpo.grid_expert_path_probability(env, (1, 1), probs)
    assert np.isclose(q[(1, 1)], 1.0) and np.isclose(q[(0, 1)], 0.2) and np.isclose(q[(1, 0)], 0.4)
    assert np.isclose(q[(0, 0)], 0.4 * 0.2 + 0.2 * 0.4)
    # a corridor with a wall: (0, 0) -> (0, 2) around nothing; unreachable cells get 0
    env2 = GridAgentEnv(layout=["...", "##."], tasks=[((0, 0), (0, 2))], max_turns=4)
    q2 = igpo.grid_expert_path_probability(env2, (0, 2), probs)
    assert np.isclose(q2[(0, 0)], 0.16) and np.isclose(q2[(1, 2)], 0.1)
    # on played episodes: (T + 1,) entries, 1 at the goal
    moves = {(0, 0): "right", (0, 1): "down", (1, 0): "right"}
    eps = play_episodes(lambda: GridAgentEnv(layout=["..", ".."], tasks=[((0, 0), (1, 1))], max_turns=4),
                        lambda envs, obs: [envs[0].actions.index(moves[e.pos]) for e in envs], [0], 1)
    pg = igpo.grid_p_gold(eps, probs, env)[0]
    assert np.allclose(pg, [0.16, 0.2, 1.0])
    assert len(igpo.igpo_advantages(eps, [pg])[0]) == 2


def test_infopo_and_egrpo_by_hand():
    # InfoPO: equal outcomes -> gate 1, A^out 0, A = A^info (normalised jointly, summed to go)
    eps = [ep(2, 0.0), ep(2, 0.0)]
    info = [np.array([0.3, 0.0]), np.array([0.1, 0.0])]
    a = igpo.infopo_advantages(eps, info, gamma=1.0, norm_adv=False)
    # flat (0.3, 0, 0.1, 0), mean 0.1: centred (0.2, -0.1 | 0, -0.1) -> to go (0.1, -0.1 | -0.1, -0.1)
    assert np.allclose(a[0], [0.1, -0.1]) and np.allclose(a[1], [-0.1, -0.1])
    # outcomes 1 and 0 (std 0.707 > 0.5): gate 0, pure GRPO
    eps2 = [ep(2, 1.0), ep(2, 0.0)]
    assert np.allclose(np.concatenate(igpo.infopo_advantages(eps2, info)),
                       np.concatenate(grpo_broadcast(eps2)))
    # the masked-feedback divergence: KL(p(.|k1) || p(.|k~1)), 0 on the last turn
    keys = [((0, 1, 2, 3), 0), ((0, 1), 1)]
    e = Episode.of(keys, [0.0, 0.0], next_state_key=((0,), 2))
    table = {((0, 1), 1): [0.5, 0.5], ((0, 1, 2, 3), 1): [0.25, 0.75]}
    div = igpo.tq_feedback_divergence([e], lambda ks: np.array([table[k] for k in ks]))[0]
    assert np.allclose(div, [0.5 * np.log(2) + 0.5 * np.log(2 / 3), 0.0])
    # E-GRPO: failures earn alpha * found; then GRPO
    eps3 = [ep(1, 1.0), ep(1, 0.0), ep(1, 0.0)]
    for e_, s in zip(eps3, [True, False, False]):
        e_.infos = [{"success": s}]
    R = igpo.egrpo_rewards(eps3, [1.0, 0.5, 0.0], alpha=0.4)
    assert np.allclose(R, [1.0, 0.2, 0.0])
    a3 = igpo.egrpo_advantages(eps3, [1.0, 0.5, 0.0], alpha=0.4, norm_adv=False)
    assert np.allclose([x[0] for x in a3], R - R.mean())
    with pytest.raises(ValueError, match="fractions"):
        igpo.egrpo_rewards(eps3, [1.5, 0, 0])
    env = TwentyQuestionsEnv(items=["dog", "eagle", "car", "airplane"], attributes=["alive"])
    e4 = Episode.of([((0, 1, 2, 3), 0)], [0.0], next_state_key=((0, 1), 1))
    assert np.allclose(igpo.tq_found_fraction([e4], env), [2 / 3])
    e4.infos = [{"success": True}]  # a correct guess found the item
    assert np.allclose(igpo.tq_found_fraction([e4], env), [1.0])


def test_lm_p_gold_equals_a_full_forward(tiny_lm):
    from agentrl_lib.rollout import observation_text, text_episodes_to_tokens, token_ids

    model, tok = tiny_lm
    game = dict(items=["dog", "eagle", "car", "airplane"], attributes=["alive", "able to fly"],
                max_turns=3, brief=True)
    env = TwentyQuestionsEnv(**game)
    eps = play_episodes(lambda: TwentyQuestionsEnv(**game),
                        lambda envs, obs: [0 if e.turn == 0 else 1 for e in envs], [0, 1], 1)
    text_episodes_to_tokens(tok, eps, env.system_prompt)
    answers = env.actions[env.num_questions:]
    gold = [env.items.index(e.task) for e in eps]
    ours = igpo.lm_p_gold(model, tok, eps, answers, gold, env.system_prompt)
    ours_norm = igpo.lm_p_gold(model, tok, eps, answers, gold, env.system_prompt, mode="answers")
    for e, g, p, pn in zip(eps, gold, ours, ours_norm):
        assert len(p) == len(e) + 1
        ctxs = [list(e.prompt_ids) + list(e.token_ids[:s]) for s, _ in e.turn_spans]
        ctxs.append(list(e.prompt_ids) + list(e.token_ids)
                    + token_ids(tok, observation_text(tok, e.final_observation, env.system_prompt)))
        for t, c in enumerate(ctxs):
            lps = []
            for a in answers:
                cont = token_ids(tok, a) + [tok.eos_token_id]
                ids = torch.tensor([c + cont])
                with torch.no_grad():
                    lp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[0]
                lps.append(sum(lp[len(c) - 1 + j, cont[j]].item() for j in range(len(cont))))
            assert np.isclose(p[t], np.exp(lps[g]), rtol=1e-3)
            assert np.isclose(pn[t], np.exp(lps[g]) / np.exp(lps).sum(), rtol=1e-3)
