"""DPO / IPO losses: hand-computed values, TRL 1.16 DPOTrainer's own loss code on the same log-probs,
the closed-form KL-regularised optimum as the population optimum of DPO on a table, and the loop."""

import math
from collections import defaultdict
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from agentrl_lib.algorithms import dpo


def t(*x):
    return torch.tensor(x, dtype=torch.float64)


def test_sigmoid_hand_values():
    # h = (-1 - -2) - (-3 - -1) = 1 + 2 = 3; beta 0.5 -> -log sigma(1.5)
    losses, m = dpo.dpo_loss(t(-1.0), t(-3.0), t(-2.0), t(-1.0), beta=0.5)
    assert losses.item() == pytest.approx(math.log1p(math.exp(-1.5)), abs=1e-12)
    assert m["rewards/chosen"] == pytest.approx(0.5)
    assert m["rewards/rejected"] == pytest.approx(-1.0)
    assert m["rewards/margins"] == pytest.approx(1.5)
    assert m["rewards/accuracies"] == 1.0
    # at the reference every pair costs log 2; accuracy counts strict wins only
    losses, m = dpo.dpo_loss(t(0, 0), t(0, 0), t(0, 0), t(0, 0))
    assert torch.allclose(losses, torch.full((2,), math.log(2), dtype=torch.float64))
    assert m["rewards/accuracies"] == 0.0


def test_label_smoothing_and_ipo_hand_values():
    # conservative DPO: eps log(1+e^{z}) + (1-eps) log(1+e^{-z}) with z = beta h = 0.1 * 3
    losses, _ = dpo.dpo_loss(t(-1.0), t(-3.0), t(-2.0), t(-1.0), beta=0.1, label_smoothing=0.2)
    z = 0.3
    assert losses.item() == pytest.approx(0.8 * math.log1p(math.exp(-z)) + 0.2 * math.log1p(math.exp(z)))
    # ipo: (h - 1/(2 beta))^2 = (3 - 1)^2 with beta 0.5
    losses, _ = dpo.dpo_loss(t(-1.0), t(-3.0), t(-2.0), t(-1.0), beta=0.5, loss_type="ipo")
    assert losses.item() == pytest.approx(4.0)
    # length-normalised: chosen ratio 1 / 2 tokens, rejected -2 / 4 tokens -> h = 1.0; (1 - 2)^2
    losses, _ = dpo.dpo_loss(t(-1.0), t(-3.0), t(-2.0), t(-1.0), beta=0.25, loss_type="ipo",
                             chosen_lengths=t(2.0), rejected_lengths=t(4.0))
    assert losses.item() == pytest.approx(1.0)


def test_bad_input_raises():
    z = torch.zeros(2)
    with pytest.raises(ValueError, match="unknown loss_type 'dpo'"):
        dpo.dpo_loss(z, z, z, z, loss_type="dpo")
    with pytest.raises(ValueError, match="label_smoothing"):
        dpo.dpo_loss(z, z, z, z, label_smoothing=0.7)
    with pytest.raises(ValueError, match="takes no extra"):
        dpo.dpo_loss(z, z, z, z, chosen_lengths=z)
    with pytest.raises(ValueError, match="unknown loss_type"):
        dpo.DPOConfig(loss_type="kto")


# --- TRL 1.16: its own _compute_loss, on a stub model whose per-token log-probs we choose -----------
class _Accel:
    device = torch.device("cpu")

    @staticmethod
    def gather(x):
        return x

    gather_for_metrics = gather


def _trl_loss(chosen, rejected, ref_chosen, ref_rejected, beta, loss_type, lengths_c, lengths_r):
    """TRL DPOTrainer._compute_loss with precomputed reference log-probs. The stub model returns
    per-token log-probs whose sum over each completion is the given sequence log-prob."""
    from trl import DPOTrainer

    B, T = len(chosen), 8
    comp_mask = torch.zeros(2 * B, T + 1, dtype=torch.long)
    lengths = torch.cat([lengths_c, lengths_r]).long()
    for i, n in enumerate(lengths.tolist()):
        comp_mask[i, 1:1 + n] = 1
    seq = torch.cat([chosen, rejected])  # (2B,)
    per_token = comp_mask[:, 1:].double() * (seq / lengths)[:, None]  # (2B, T)
    outputs = SimpleNamespace(log_probs=per_token, entropy=torch.zeros(2 * B, T),
                              mean_logits=torch.zeros(2 * B, T),
                              is_top1=torch.zeros(2 * B, T, dtype=torch.bool), aux_loss=None)
    trainer = SimpleNamespace(
        model=SimpleNamespace(training=True), accelerator=_Accel(), aux_loss_enabled=False,
        ld_alpha=None, precompute_ref_logps=True, f_divergence_type="reverse_kl",
        loss_types=[loss_type], loss_weights=[1.0], beta=beta, label_smoothing=0.0,
        use_weighting=False, _metrics={"train": defaultdict(list)}, _total_train_tokens=0, _tp_size=1)
    inputs = {"input_ids": torch.zeros(2 * B, T + 1, dtype=torch.long), "attention_mask": comp_mask,
              "completion_mask": comp_mask, "ref_chosen_logps": ref_chosen,
              "ref_rejected_logps": ref_rejected}
    loss = DPOTrainer._compute_loss(trainer, lambda **kw: outputs, inputs, False)
    return loss, {k: v[-1] for k, v in trainer._metrics["train"].items()}


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo"])
def test_equal_to_trl_dpo_trainer(loss_type):
    g = torch.Generator().manual_seed(0)
    B = 6
    c, r, rc, rr = (-5 * torch.rand(B, generator=g, dtype=torch.float64) for _ in range(4))
    n_c = torch.randint(1, 8, (B,), generator=g).double()
    n_r = torch.randint(1, 8, (B,), generator=g).double()
    kw = dict(chosen_lengths=n_c, rejected_lengths=n_r) if loss_type == "ipo" else {}
    for beta in (0.1, 0.5):
        ours, m = dpo.dpo_loss(c, r, rc, rr, beta=beta, loss_type=loss_type, **kw)
        theirs, tm = _trl_loss(c, r, rc, rr, beta, loss_type, n_c, n_r)
        assert ours.mean().item() == pytest.approx(theirs.item(), rel=1e-9, abs=1e-12)
        for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
            assert m[k] == pytest.approx(tm[k], rel=1e-9, abs=1e-12), k


# --- the theorem behind DPO, exact on a table ------------------------------------------------------
def test_population_optimum_is_the_kl_regularised_optimum():
    """With Bradley-Terry preferences of utilities u, the expected DPO loss over all ordered pairs is
    minimised by pi_ref exp(u / beta) / Z (Rafailov et al. 2023, Prop. 1 / eq. 4)."""
    u = torch.tensor([1.0, 0.2, -0.5, 0.0], dtype=torch.float64)
    ref = torch.tensor([0.1, 0.4, 0.3, 0.2], dtype=torch.float64)
    beta = 0.5
    K = len(u)
    i, j = torch.meshgrid(torch.arange(K), torch.arange(K), indexing="ij")
    i, j = i[i != j], j[i != j]
    P = torch.sigmoid(u[i] - u[j])  # Pr(i beats j)
    logits = torch.zeros(K, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([logits], lr=1, max_iter=200, tolerance_grad=1e-12, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        lp = torch.log_softmax(logits, 0)
        losses, _ = dpo.dpo_loss(lp[i], lp[j], ref.log()[i], ref.log()[j], beta=beta)
        loss = (P * losses).sum()
        loss.backward()
        return loss

    opt.step(closure)
    pi = torch.softmax(logits, 0).detach().numpy()
    assert np.allclose(pi, dpo.kl_optimal_policy(ref.numpy(), u.numpy(), beta), atol=1e-6)
    # hand check of kl_optimal_policy on two responses: ref (1/2, 1/2), r (log 2, 0), beta 1 -> (2/3, 1/3)
    assert np.allclose(dpo.kl_optimal_policy([0.5, 0.5], [math.log(2), 0.0], 1.0), [2 / 3, 1 / 3])


def test_train_moves_toward_the_chosen_and_lr0_does_not():
    chosen, rejected = torch.tensor([0, 0, 1]), torch.tensor([1, 2, 2])
    for lr, moved in ((0.1, True), (0.0, False)):
        logits = torch.zeros(3, requires_grad=True)
        pl = dpo.tabular_pair_logps(logits, chosen, rejected)
        ref_c, ref_r = dpo.reference_logps(pl, 3)
        cfg = dpo.DPOConfig(beta=0.5, lr=lr, num_epochs=20, batch_size=2)
        hist = dpo.train([logits], pl, 3, cfg, ref_c, ref_r)
        assert len(hist) == 20 * 2 and hist[0]["losses/dpo"] == pytest.approx(math.log(2))
        if moved:
            p = torch.softmax(logits, 0)
            assert p[0] > p[1] > p[2] and hist[-1]["losses/dpo"] < 0.6
        else:
            assert torch.equal(logits.detach(), torch.zeros(3))


def test_lm_sequence_logps_equal_token_sums():
    from agentrl_lib.models.tiny_lm import new_model
    from agentrl_lib.rollout import chat_example

    model, tok = new_model("tiny-64", seed=0)
    prompts, comps = ["1+2=", "13+4="], ["3", "17 no"]
    got = dpo.lm_sequence_logps(model, tok, prompts, comps)
    for k, (p, c) in enumerate(zip(prompts, comps)):  # one sequence at a time, no padding
        ids, mask = chat_example(tok, p, c)
        x = torch.tensor([ids])
        lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
        want = sum(lp[s - 1, ids[s]].item() for s in range(1, len(ids)) if mask[s])
        assert got[k].item() == pytest.approx(want, abs=1e-4)


def test_rationale_nll_hand_values():
    # scores (1, 2, 0): p = e^s / (e + e^2 + 1); rationale 1 -> -log p_1, gamma scales it
    s = torch.tensor([[1.0, 2.0, 0.0], [0.0, 0.0, 0.0]], dtype=torch.float64)
    losses, m = dpo.rationale_nll(s, torch.tensor([1, 2]), gamma=0.5)
    z = math.e + math.e ** 2 + 1
    assert losses[0].item() == pytest.approx(-0.5 * math.log(math.e ** 2 / z))
    assert losses[1].item() == pytest.approx(0.5 * math.log(3))
    assert m["rationale/accuracy"] == 0.5  # argmax of the tie is 0, not 2
    with pytest.raises(ValueError, match="must be"):
        dpo.rationale_nll(torch.zeros(3), torch.tensor([0, 1, 2]))


def test_lm_rationale_nll_equals_manual_token_sum():
    from agentrl_lib.models.tiny_lm import new_model

    model, tok = new_model("tiny-64", seed=0)
    prompts, chosen, rejected = ["1+2=", "13+4="], ["3", "the answer is 17"], ["4", "18"]
    rats = ["A is correct: 1+2=3", "A is longer"]
    got, m = dpo.lm_rationale_nll(model, tok, prompts, chosen, rejected, rats, gamma=0.5)
    total_nll, total_tokens = 0.0, 0
    for k in range(2):  # one sequence at a time, no padding, the context written out by hand
        head = tok.apply_chat_template(
            [{"role": "user", "content": f"{prompts[k]} A: {chosen[k]} B: {rejected[k]} why A?"}],
            add_generation_prompt=True, tokenize=False)
        h_ids = tok(head, add_special_tokens=False)["input_ids"]
        r_ids = tok(rats[k], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        x = torch.tensor([h_ids + r_ids])
        lp = torch.log_softmax(model(input_ids=x).logits[0, :-1].float(), -1)
        nll = -sum(lp[len(h_ids) + s - 1, t_].item() for s, t_ in enumerate(r_ids))
        assert got[k].item() == pytest.approx(0.5 * nll, abs=1e-4)
        total_nll, total_tokens = total_nll + nll, total_tokens + len(r_ids)
    assert m["rationale/nll_per_token"] == pytest.approx(total_nll / total_tokens, abs=1e-5)
    got[0].backward()  # differentiable
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    with pytest.raises(ValueError, match="one entry per pair"):
        dpo.lm_rationale_nll(model, tok, prompts, chosen, rejected, rats[:1])
