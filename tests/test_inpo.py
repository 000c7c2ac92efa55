"""INPO's loss (the ``inpo`` branch of ``dpo.dpo_loss``) and the tabular self-play rounds, against
hand-computed numbers and the closed-form mirror-descent step."""

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import dpo, inpo
from agentrl_lib.envs.pref_bandit import PrefBandit, exploitability, minimax_winner


def t(*x):
    return torch.tensor(x, dtype=torch.float64)


def test_inpo_loss_by_hand():
    # h = (c - r) - eta beta (ref_c - ref_r) - (1 - eta beta)(prev_c - prev_r)
    #   = 1 - 0.2 * 0 - 0.8 * 0.6 = 0.52;  loss = (0.52 - eta/2)^2 = 0.2304
    losses, m = dpo.dpo_loss(t(-1.0), t(-2.0), t(-1.5), t(-1.5), beta=0.1, loss_type="inpo",
                             prev_chosen_logps=t(-1.2), prev_rejected_logps=t(-1.8), eta=2.0)
    assert losses.item() == pytest.approx(0.2304)
    assert m["rewards/chosen"] == pytest.approx(0.1 * 0.5) and m["rewards/accuracies"] == 1.0
    # at pi = pi_t = pi_ref the loss is (eta/2)^2
    z = torch.zeros(3, dtype=torch.float64)
    losses, _ = dpo.dpo_loss(z, z, z, z, beta=0.5, loss_type="inpo", prev_chosen_logps=z,
                             prev_rejected_logps=z, eta=1.0)
    assert torch.allclose(losses, torch.full((3,), 0.25, dtype=torch.float64))


def test_inpo_bad_arguments_are_named():
    z = t(0.0)
    with pytest.raises(ValueError, match="missing"):
        dpo.dpo_loss(z, z, z, z, beta=0.1, loss_type="inpo", eta=1.0)
    with pytest.raises(ValueError, match="unknown"):
        dpo.dpo_loss(z, z, z, z, beta=0.1, loss_type="inpo", prev_chosen_logps=z,
                     prev_rejected_logps=z, eta=1.0, chosen_lengths=z)
    with pytest.raises(ValueError, match="eta \\* beta <= 1"):
        dpo.dpo_loss(z, z, z, z, beta=0.5, loss_type="inpo", prev_chosen_logps=z,
                     prev_rejected_logps=z, eta=3.0)
    with pytest.raises(ValueError, match="unknown loss_type"):
        inpo.IterConfig(loss_type="ipo")


def test_population_minimiser_is_the_mirror_descent_step():
    b = PrefBandit.rock_paper_scissors(margins=(0.6, 0.9, 0.3), num_dominated=2)
    ref = np.array([0.1, 0.2, 0.3, 0.25, 0.15])
    pi_t = np.array([0.3, 0.1, 0.2, 0.3, 0.1])
    beta, eta = 0.1, 2.0
    c, r, w = inpo.population_pairs(pi_t, b.P)
    assert w.sum() == pytest.approx(1.0) and len(c) == 20
    theta, _ = inpo.fit_round(np.log(pi_t), ref, c, r, w, "inpo", beta, eta, 3000, 0.05)
    p = np.exp(theta - theta.max())
    p /= p.sum()
    target = inpo.omd_update(pi_t, ref, b.P, beta, eta)
    # the closed form, by hand for one ratio: log p0/p1 = 0.8 log 3 + 0.2 log 0.5 + 2 ((P pi)_0 - (P pi)_1)
    wr = b.P @ pi_t
    assert np.log(target[0] / target[1]) == pytest.approx(
        0.8 * np.log(3.0) + 0.2 * np.log(0.5) + 2 * (wr[0] - wr[1]))
    assert np.allclose(p, target, atol=2e-4)


def test_sampled_pairs_match_the_population_weights():
    b = PrefBandit.rock_paper_scissors(margins=(0.5, 0.2, 0.8))
    pi_t = np.array([0.5, 0.3, 0.2])
    rng = np.random.default_rng(0)
    c, r, w = inpo.sample_pairs(b, pi_t, 60000, rng)
    assert np.all(c != r) and w.sum() == pytest.approx(1.0)
    freq = np.zeros((3, 3))
    np.add.at(freq, (c, r), 1.0)
    pc, pr, pw = inpo.population_pairs(pi_t, b.P)
    assert np.allclose(freq[pc, pr] / len(c), pw, atol=0.01)


def test_dpo_train_accepts_inpo_with_per_pair_previous_logps():
    logits = torch.zeros(3, dtype=torch.float64, requires_grad=True)
    chosen, rejected = torch.tensor([0, 1, 2, 0]), torch.tensor([1, 2, 0, 2])
    pair_logps = dpo.tabular_pair_logps(logits, chosen, rejected)
    ref_c, ref_r = dpo.reference_logps(pair_logps, 4)
    cfg = dpo.DPOConfig(loss_type="inpo", beta=0.1, lr=0.05, num_epochs=3, batch_size=2)
    hist = dpo.train([logits], pair_logps, 4, cfg, ref_c, ref_r, prev_chosen_logps=ref_c.clone(),
                     prev_rejected_logps=ref_r.clone(), eta=1.0)
    assert len(hist) == 6 and logits.abs().sum() > 0


def test_inpo_approaches_the_nash_policy_and_small_beta_dpo_collapses():
    b = PrefBandit.rock_paper_scissors(margins=(0.6, 0.9, 0.3), num_dominated=2)
    ref = np.array([0.15, 0.15, 0.15, 0.35, 0.2])
    mw = minimax_winner(b)
    o = inpo.iterate(b, inpo.IterConfig("inpo", num_iters=25, beta=0.05, eta=2.0, inner_steps=60,
                                        inner_lr=0.2), ref, target=mw)
    assert o["exploitability"][0] == pytest.approx(exploitability(ref, b.P))
    assert np.mean(o["exploitability"][-5:]) < 0.5 * o["exploitability"][0]
    d = inpo.iterate(b, inpo.IterConfig("sigmoid", num_iters=5, beta=0.05, inner_steps=60,
                                        inner_lr=0.2), ref, target=mw)
    assert d["pis"][-1].max() > 0.95 and d["exploitability"][-1] > 0.1


def test_lm_candidate_logps_are_the_softmax_of_token_sums_over_the_set():
    from agentrl_lib.models.tiny_lm import new_model
    from agentrl_lib.rollout import chat_example

    model, tok = new_model("tiny-64", seed=0)
    prompts, cands = ["1+2=", "13+4="], [["3", "4", "30"], ["17", "16 no", "7"]]
    got = inpo.lm_candidate_logps(model, tok, prompts, cands)  # (2, 3)
    assert got.shape == (2, 3)
    for s, (p, cs) in enumerate(zip(prompts, cands)):  # one sequence at a time, no padding
        seq = []
        for c in cs:
            ids, mask = chat_example(tok, p, c)
            lp = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0, :-1].float(), -1)
            seq.append(sum(lp[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t]))
        want = np.array(seq) - np.log(np.exp(np.array(seq)).sum())
        assert np.allclose(got[s].detach().numpy(), want, atol=1e-4)
    with pytest.raises(ValueError, match="candidates"):
        inpo.lm_candidate_logps(model, tok, prompts, [["3", "4"], ["17"]])


def test_lm_iterate_curves_and_lr0_keeps_the_reference():
    from agentrl_lib.models.tiny_lm import new_model

    model, tok = new_model("tiny-64", seed=0)
    game = PrefBandit.rock_paper_scissors(margins=(0.6, 0.9, 0.3), num_dominated=1)
    prompts, cands = ["1+2="], [["3", "4", "2", "13"]]
    with torch.no_grad():
        ref = inpo.lm_candidate_logps(model, tok, prompts, cands)
    for lt in inpo.LOSS_TYPES:
        out = inpo.lm_iterate(model, tok, prompts, cands, game,
                              inpo.IterConfig(lt, 2, 8, 0.1, 1.0, 2, 0.0, 0), ref)
        assert out["pis"].shape == (3, 1, 4)
        assert np.allclose(out["pis"][-1], out["pis"][0], atol=1e-6)  # lr 0: nothing moves
        want = exploitability(ref.exp().double().numpy()[0], game.P)
        assert out["exploitability"] == pytest.approx([want] * 3, abs=1e-5)


def test_implicit_reward_agreement_by_hand():
    P = np.array([[0.5, 0.8, 0.3], [0.2, 0.5, 0.9], [0.7, 0.1, 0.5]])
    ref = np.array([0.5, 0.3, 0.2])
    assert inpo.implicit_reward_agreement(ref, ref, P) == 0.5  # r = 0: every pair a tie
    # r = (2, 1, 0): 0 above 1 (P[0, 1] = 0.8), 0 above 2 (P[0, 2] = 0.3), 1 above 2 (0.9)
    pi = ref * np.exp([2.0, 1.0, 0.0])
    pi /= pi.sum()
    assert inpo.implicit_reward_agreement(pi, ref, P) == pytest.approx((0.8 + 0.3 + 0.9) / 3)
    # the reversed ranking takes the complements; a tie between 0 and 1 gives that pair 1/2
    rev = ref * np.exp([0.0, 1.0, 2.0])
    assert inpo.implicit_reward_agreement(rev / rev.sum(), ref, P) == pytest.approx(
        (0.2 + 0.7 + 0.1) / 3)
    tie = ref * np.exp([1.0, 1.0, 0.0])
    assert inpo.implicit_reward_agreement(tie / tie.sum(), ref, P) == pytest.approx(
        (0.5 + 0.3 + 0.9) / 3)
    # (S, K): the mean over prompts
    both = inpo.implicit_reward_agreement(np.stack([pi, ref]), np.stack([ref, ref]), P)
    assert both == pytest.approx(((0.8 + 0.3 + 0.9) / 3 + 0.5) / 2)


def test_implicit_reward_agreement_rises_under_bt_dpo_on_a_transitive_judge():
    # a Bradley-Terry judge (utilities 0 > 1 > 2): exact DPO rounds learn its order, agreement is
    # then the mean of the upper triangle; the start (pi = pi_ref) is 1/2
    u = np.array([1.0, 0.0, -1.0])
    P = 1 / (1 + np.exp(-(u[:, None] - u[None, :])))
    game, ref = PrefBandit(P), np.full(3, 1 / 3)
    out = inpo.iterate(game, inpo.IterConfig("sigmoid", 3, 0, 1.0, 1.0, 100, 0.1), ref)
    assert inpo.implicit_reward_agreement(out["pis"][0], ref, P) == 0.5
    assert inpo.implicit_reward_agreement(out["pis"][-1], ref, P) == pytest.approx(
        P[np.triu_indices(3, 1)].mean())
