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


def _infopo_token_level(R, info_tokens, mask, index, beta, T, eps=1e-6, norm=True):
    """An independent token-level re-implementation of InfoPO's released
    ``compute_info_grpo_advantage`` (kfq20/InfoPO @ c26e93c, single-turn outcome branch), written
    step by step in torch on (B, L) tensors with a response mask, as the released function takes
    them: GRPO on the summed outcome (a group of one: mean 0, std 1), the intrinsic values
    normalised per group over their non-zero masked entries, the batch magnitude ratio over the
    masked entries, the sigmoid gate of the group std, and the fusion."""
    B = len(R)
    scores = torch.tensor(R, dtype=torch.float64)
    groups = {}
    for b in range(B):
        groups.setdefault(index[b], []).append(b)
    mean_o, std_o = {}, {}
    for g, mem in groups.items():
        v = scores[mem]
        mean_o[g], std_o[g] = (torch.tensor(0.0), torch.tensor(1.0)) if len(mem) == 1 else \
            (v.mean(), v.std())
    adv_o = torch.stack([((scores[b] - mean_o[index[b]]) / (std_o[index[b]] + eps)) if norm
                         else scores[b] - mean_o[index[b]] for b in range(B)])
    adv_o = adv_o[:, None] * mask  # (B, L)
    vals = {}
    for b in range(B):
        row = info_tokens[b][mask[b].bool()]
        vals.setdefault(index[b], []).extend(row[row != 0].tolist())
    adv_i = torch.zeros_like(info_tokens)
    for b in range(B):
        v = vals.get(index[b], [])
        if not v:
            continue
        m, s = (v[0], 1.0) if len(v) == 1 else (torch.tensor(v).mean().item(),
                                                 torch.tensor(v).std().item())
        nz = (info_tokens[b] != 0) & mask[b].bool()
        adv_i[b][nz] = (info_tokens[b][nz] - m) / (s + eps) if norm else info_tokens[b][nz] - m
    msk = mask.bool()
    o_std = adv_o[msk].std().item() + eps
    i_std = adv_i[msk].std().item() + eps
    ratio = min(1.0, max(o_std, 1.0) / i_std)
    gate = torch.tensor([torch.sigmoid(torch.tensor(-std_o[index[b]].item() / T)).item()
                         for b in range(B)], dtype=torch.float64)[:, None]
    return adv_o + beta * gate * adv_i * ratio


def test_infopo_by_hand():
    # equal outcomes: A^out 0, gate sigmoid(0) = 1/2; non-zero values (0.3, 0.1): mean 0.2, std
    # 0.1414 -> z = +-0.7071; zeros stay 0; batch stds: A^out 0 -> target 1, A^info 0.5774 -> rho 1
    eps = [ep(2, 0.0), ep(2, 0.0)]
    info = [np.array([0.3, 0.0]), np.array([0.1, 0.0])]
    a = igpo.infopo_advantages(eps, info, beta=0.5, gate_temperature=0.5)
    z = 0.1 / (np.sqrt(0.02) + 1e-6)
    assert np.allclose(a[0], [0.25 * z, 0.0]) and np.allclose(a[1], [-0.25 * z, 0.0])
    # no return-to-go: a later zero does not inherit an earlier value (the old form summed to go)
    assert a[0][1] == 0.0
    # outcomes 1, 0 (std 0.7071): A^out = +-0.7071; gate sigmoid(-0.7071 / T); rho 1
    eps2 = [ep(2, 1.0), ep(2, 0.0)]
    for T in (0.5, 0.05):
        a2 = igpo.infopo_advantages(eps2, info, beta=0.1, gate_temperature=T)
        g = 1 / (1 + np.exp(np.sqrt(0.5) / T))
        o = 0.5 / (np.sqrt(0.5) + 1e-6)
        assert np.allclose(a2[0], [o + 0.1 * g * z, o]) and np.allclose(a2[1], [-o - 0.1 * g * z, -o])
    # a single non-zero value in its group: mean = it, std 1 -> 0; a group of none: 0 everywhere
    eps3 = [ep(2, 0.0, 0), ep(1, 0.0, 0), ep(2, 1.0, 1), ep(1, 1.0, 1)]
    a3 = igpo.infopo_advantages(eps3, [[0.4, 0.0], [0.0], [0.0, 0.0], [0.0]])
    assert all(np.all(x == 0) for x in a3)
    # the magnitude ratio: A^info is scaled down to std max(std A^out, 1) = 1 when it is wider
    # (ddof 1 over the batch's 4 turns, zeros included); norm_adv=False centres without dividing
    eps4 = [ep(2, 0.0), ep(2, 0.0)]
    a4 = igpo.infopo_advantages(eps4, [[5.0, 1.0], [3.0, 0.0]], beta=1.0, gate_temperature=1.0,
                                norm_adv=False)
    # non-zero (5, 1, 3): mean 3 -> (2, -2 | 0, 0); std over (2, -2, 0, 0) = 1.633 > 1: rho 0.6124
    rho = 1.0 / (np.std([2.0, -2.0, 0.0, 0.0], ddof=1) + 1e-6)
    assert np.allclose(a4[0], [0.5 * rho * 2, -0.5 * rho * 2]) and np.allclose(a4[1], [0.0, 0.0])
    # decay: beta_t = beta exp(-decay epoch)
    a5 = igpo.infopo_advantages(eps, info, beta=0.5, decay=0.1, epoch=3)
    assert np.allclose(a5[0], np.exp(-0.3) * a[0])
    with pytest.raises(ValueError, match="info"):
        igpo.infopo_advantages(eps, [[0.1]])


def test_infopo_equals_the_released_token_level_computation():
    rng = np.random.default_rng(0)
    moved = 0
    for trial in range(30):
        eps, info = [], []
        for g in range(3):
            for _ in range(int(rng.integers(1, 5))):
                T = int(rng.integers(1, 5))
                eps.append(ep(T, float(rng.integers(2)), g))
                x = rng.normal(size=T) * (rng.random(T) < 0.6)  # some exact zeros
                x[-1] = 0.0  # the last turn has no next action
                info.append(x)
        beta, T = float(rng.choice([0.1, 0.5])), float(rng.choice([0.05, 0.5]))
        norm = bool(trial % 5)
        ours = igpo.infopo_advantages(eps, info, beta=beta, gate_temperature=T, norm_adv=norm)
        L = max(len(e) for e in eps) + 2  # right padding the mask removes
        mask = torch.zeros(len(eps), L, dtype=torch.float64)
        tok = torch.zeros(len(eps), L, dtype=torch.float64)
        for b, x in enumerate(info):
            mask[b, :len(x)] = 1
            tok[b, :len(x)] = torch.as_tensor(x)
            tok[b, len(x):] = 7.0  # garbage under the mask must not count
        ref = _infopo_token_level([e.ret for e in eps], tok, mask, [e.group_id for e in eps],
                                  beta, T, norm=norm)
        for b, a in enumerate(ours):
            assert np.allclose(a, ref[b, :len(a)].numpy(), atol=1e-10), (trial, b)
        outcome_only = igpo.infopo_advantages(eps, info, beta=0.0, norm_adv=norm)
        moved += not np.allclose(np.concatenate(ours), np.concatenate(outcome_only), atol=1e-6)
    assert moved >= 20  # the information term took part in the comparison (not vacuous)


def test_egrpo_and_feedback_divergence_by_hand():
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
    ours = igpo.lm_p_gold(model, tok, eps, answers, gold, env.system_prompt, mode="raw")
    ours_norm = igpo.lm_p_gold(model, tok, eps, answers, gold, env.system_prompt, mode="answers")
    ours_mean = igpo.lm_p_gold(model, tok, eps, answers, gold, env.system_prompt)  # "mean"
    with pytest.raises(ValueError, match="mode"):
        igpo.lm_p_gold(model, tok, eps, answers, gold, env.system_prompt, mode="sum")
    for e, g, p, pn, pm in zip(eps, gold, ours, ours_norm, ours_mean):
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
            # the released form: force the pseudo-response (answer text + end of turn), take the
            # log-probs of its tokens, exp of their mean over the answer span (end of turn out)
            resp = token_ids(tok, answers[g]) + [tok.eos_token_id]
            with torch.no_grad():
                full = torch.log_softmax(model(input_ids=torch.tensor([c + resp])).logits.float(),
                                         -1)[0]
            old_log_probs = torch.stack([full[len(c) - 1 + j, resp[j]] for j in range(len(resp))])
            gt_idx = (0, len(resp) - 1)  # the answer's span: before the end-of-turn token
            assert np.isclose(pm[t], torch.exp(old_log_probs[gt_idx[0]:gt_idx[1]].mean()).item(),
                              rtol=1e-4)
            assert pm[t] >= p[t]  # a geometric mean of probabilities <= 1 is >= their product
