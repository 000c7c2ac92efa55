"""PPO for language models (agentrl_lib.algorithms.ppo_lm): token-level GAE with masks by hand,
reward placement, the value model's shapes and parameter sharing, the losses by hand, one update
moving both networks, config errors, and the loop's rows against grpo.train's."""

import math

import pytest
import torch

from agentrl_lib import core
from agentrl_lib.algorithms import grpo, ppo_lm
from agentrl_lib.algorithms.ppo_lm import PPOLMConfig
from agentrl_lib.models.tiny_lm import new_model
from agentrl_lib.rollout import format_prompts, generate, sequence_logps


def chat(tok, texts):
    return format_prompts(tok, [{"prompt": t} for t in texts])


# --- rewards and GAE by hand -----------------------------------------------------------------
def test_reward_on_last_real_token():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]])
    r = ppo_lm.token_rewards(torch.tensor([1.0, 0.5, -1.0, 7.0]), mask)
    assert r.tolist() == [[0, 1, 0, 0], [0, 0, 0, 0.5], [-1, 0, 0, 0], [0, 0, 0, 0]]
    # with a KL penalty: -beta * (logp - ref_logp) on real tokens only (k1)
    logps = torch.full((4, 4), -1.0)
    ref = torch.full((4, 4), -1.5)
    r_kl = ppo_lm.token_rewards(torch.tensor([1.0, 0.5, -1.0, 7.0]), mask, logps, ref, beta=0.1)
    expected = r - 0.1 * 0.5 * mask.float()
    assert torch.allclose(r_kl, expected)
    assert r_kl[3].abs().sum() == 0 and r_kl[0, 2:].abs().sum() == 0
    with pytest.raises(ValueError, match="needs logps and ref_logps"):
        ppo_lm.token_rewards(torch.ones(4), mask, beta=0.1)


def test_kl_reward_is_trls_by_hand():
    """TRL's PPOTrainer (huggingface/trl @ f2cd577, ``trl/experimental/ppo/ppo_trainer.py``): k1
    ``kl = -(ref_logprobs - logprobs)``, ``rewards = -kl_coef * kl``, the score added at the end;
    defaults ``kl_coef = 0.05``, ``kl_estimator = "k1"``. A 2 x 3 batch worked out by hand."""
    cfg = PPOLMConfig()
    assert (cfg.beta, cfg.kl_estimator) == (0.05, "k1")
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    logps = torch.tensor([[-0.5, -1.0, -7.0], [-2.0, -0.1, -0.3]])
    ref = torch.tensor([[-0.7, -0.4, -9.0], [-2.0, -0.6, -0.2]])
    r = ppo_lm.token_rewards(torch.tensor([1.0, 0.0]), mask, logps, ref, beta=0.05)
    # row 0: kl = [0.2, -0.6] -> [-0.01, +0.03 + 1]; row 1: kl = [0, 0.5, -0.1] -> [0, -0.025, 0.005]
    assert torch.allclose(r, torch.tensor([[-0.01, 1.03, 0.0], [0.0, -0.025, 0.005]]), atol=1e-7)
    # k3 = exp(log r) - 1 - log r >= 0 on each token: token (0, 0) has log r = -0.2
    r3 = ppo_lm.token_rewards(torch.zeros(2), mask, logps, ref, beta=0.05, kl_estimator="k3")
    assert r3[0, 0].item() == pytest.approx(-0.05 * (math.exp(-0.2) - 1 + 0.2))
    assert (r3 <= 0).all() and r3[0, 2] == 0


def test_train_makes_a_frozen_reference_and_logs_kl(tiny_lm):
    """beta > 0 without a ref_model: a frozen copy of the start is the reference (TRL's
    create_reference_model); at the first update policy = reference, so the KL is ~0, and it
    grows once the policy moves; beta = 0 logs no KL."""
    model, tok = tiny_lm
    problems = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(5) for b in range(5)]
    start = [p.detach().clone() for p in model.parameters()]
    cfg = PPOLMConfig(num_prompts=4, group_size=2, num_iters=3, max_new_tokens=4, lr=3e-2)
    rows = ppo_lm.train(model, grpo.completion_sampler(tok, problems, [odd_length], cfg), cfg)
    kls = [r["losses/kl"] for r in rows if "losses/kl" in r]
    assert len(kls) == 3 and abs(kls[0]) < 1e-4 and abs(kls[-1]) > 1e-3
    assert any(not torch.equal(a, b) for a, b in zip(start, model.parameters()))
    ref = ppo_lm.make_reference(model)
    assert all(not p.requires_grad for p in ref.parameters()) and not ref.training
    with pytest.raises(ValueError, match="same object"):
        ppo_lm.train(model, grpo.completion_sampler(tok, problems, [odd_length], cfg), cfg,
                     ref_model=model)
    cfg0 = PPOLMConfig(beta=0.0, num_prompts=4, num_iters=1, max_new_tokens=4)
    rows0 = ppo_lm.train(model, grpo.completion_sampler(tok, problems, [odd_length], cfg0), cfg0)
    assert not any("losses/kl" in r for r in rows0)


def test_token_gae_by_hand_with_masks():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    r = ppo_lm.token_rewards(torch.tensor([1.0, 0.5]), mask)
    v = torch.tensor([[0.2, 0.5, 9.0], [0.1, 0.2, 0.4]])  # 9.0: a critic's output on padding
    adv, ret = ppo_lm.token_gae(r, v, mask, gamma=1.0, lam=0.5)
    # row 0: delta = [0 + 0.5 - 0.2, 1 - 0.5] = [0.3, 0.5]; A_1 = 0.5, A_0 = 0.3 + 0.5 * 0.5
    # row 1: delta = [0.2 - 0.1, 0.4 - 0.2, 0.5 - 0.4]; A = [0.1 + 0.5 * 0.25, 0.2 + 0.5 * 0.1, 0.1]
    assert torch.allclose(adv, torch.tensor([[0.55, 0.5, 0.0], [0.225, 0.25, 0.1]]))
    assert torch.allclose(ret, torch.tensor([[0.75, 1.0, 0.0], [0.325, 0.45, 0.5]]))
    # nothing after the end leaks: any value on the padding gives the same advantages
    adv2, _ = ppo_lm.token_gae(r, v * torch.tensor([[1.0, 1.0, -3.0], [1, 1, 1]]), mask, 1.0, 0.5)
    assert torch.equal(adv, adv2)
    # lam = 1, gamma = 1: A_t = R - V(s_t), the return from every token is the outcome
    adv1, ret1 = ppo_lm.token_gae(r, v, mask, gamma=1.0, lam=1.0)
    assert torch.allclose(adv1, torch.tensor([[0.8, 0.5, 0.0], [0.4, 0.3, 0.1]]))
    assert torch.allclose(ret1, torch.tensor([[1.0, 1.0, 0.0], [0.5, 0.5, 0.5]]))
    # lam = 0: the one-step TD error
    adv0, _ = ppo_lm.token_gae(r, v, mask, gamma=1.0, lam=0.0)
    assert torch.allclose(adv0, torch.tensor([[0.3, 0.5, 0.0], [0.1, 0.2, 0.1]]))


def test_naive_gae_leaks_padding_values():
    """The bug the masks prevent: GAE over the whole window bootstraps from padding values."""
    mask = torch.tensor([[1, 1, 0]])
    r = ppo_lm.token_rewards(torch.tensor([1.0]), mask)
    v = torch.tensor([[0.2, 0.5, 9.0]])
    naive, _ = core.gae_advantages(r, v, torch.zeros(1, 3), torch.zeros(1), 1.0, 0.5)
    ours, _ = ppo_lm.token_gae(r, v, mask, 1.0, 0.5)
    assert naive[0, 1].item() == pytest.approx(1 + 9.0 - 0.5 - 9.0 * 0.5)  # delta_1 + 0.5 * delta_2
    assert ours[0, 1].item() == pytest.approx(0.5)


def test_losses_by_hand():
    cfg = PPOLMConfig(vf_coef=0.1, clip_eps_value=0.2)
    mask = torch.tensor([[1, 1, 0]])
    zeros = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 5.0]])
    values = torch.tensor([[0.5, 0.0, 3.0]])
    old_values = torch.tensor([[0.0, 0.0, 0.0]])
    returns = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m = ppo_lm.ppo_lm_losses(zeros, zeros, adv, values, old_values, returns, mask, cfg)
    # ratio 1: L_clip = -mean(A) over real tokens = 0; value token 0: V moved 0.5 > 0.2, clipped to
    # 0.2, max((0.5-1)^2, (0.2-1)^2) = 0.64; token 1: 1.0; L_V = 0.5 * (0.64 + 1.0) / 2 = 0.41
    assert m["policy_loss"] == pytest.approx(0.0, abs=1e-7)
    assert m["value_loss"] == pytest.approx(0.41)
    assert loss.item() == pytest.approx(0.041)
    assert m["vf_clipfrac"] == pytest.approx(0.5)
    _, m_off = ppo_lm.ppo_lm_losses(zeros, zeros, adv, values, old_values, returns, mask,
                                    PPOLMConfig(clip_eps_value=0.0))
    assert m_off["value_loss"] == pytest.approx(0.5 * (0.25 + 1.0) / 2)


def test_whiten_advantages_is_trls_masked_whiten():
    # by hand: real tokens 1, 2, 3 (mean 2, squares 1 + 0 + 1 over N - 1 = 2: var 1, TRL's
    # masked_var with unbiased=True), so A = (x - 2) * rsqrt(1 + 1e-8); padding gives 0
    x = torch.tensor([[1.0, 2.0, 7.0], [3.0, -4.0, 9.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    want = torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]) / math.sqrt(1 + 1e-8)
    assert torch.allclose(ppo_lm.whiten_advantages(x, mask), want, atol=1e-7)
    # TRL's formula on a random ragged batch: masked_mean, then the Bessel-corrected masked_var
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 7, generator=gen, dtype=torch.float64)
    lengths = torch.tensor([1, 7, 3, 4, 2])
    mask = (torch.arange(7)[None] < lengths[:, None]).to(torch.float64)
    n = mask.sum()
    mean = (x * mask).sum() / n
    var = ((x - mean) ** 2 * mask).sum() / n * (n / (n - 1))
    trl = (x - mean) * torch.rsqrt(var + 1e-8)
    got = ppo_lm.whiten_advantages(x, mask)
    assert torch.allclose(got, trl * mask, atol=1e-12)
    # ddof 1: the real tokens' squares sum to N - 1 (up to eps), not N
    assert (got ** 2).sum().item() == pytest.approx(n.item() - 1, rel=1e-6)


# --- the value model ---------------------------------------------------------------------------
def test_value_model_shapes_and_parameters(tiny_lm):
    model, tok = tiny_lm
    n_policy = sum(p.numel() for p in model.parameters())
    H = model.config.hidden_size
    sep = ppo_lm.make_value_model(model, "separate")
    shared = ppo_lm.make_value_model(model, "shared")
    assert not sep.shares_trunk_with(model) and shared.shares_trunk_with(model)
    assert sum(p.numel() for p in ppo_lm.critic_parameters(model, shared)) == H + 1
    n_trunk = sum(p.numel() for p in model.base_model.parameters())
    assert sum(p.numel() for p in ppo_lm.critic_parameters(model, sep)) == n_trunk + H + 1
    assert n_trunk == n_policy  # tied embeddings: the LM head owns no parameters of its own

    g = generate(model, tok, chat(tok, ["1+2=", "33*4="]), max_new_tokens=5,
                 generator=torch.Generator().manual_seed(0))
    B, T = g.completion_ids.shape
    args = (g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)
    ref_logps, ref_ents = sequence_logps(model, *args)
    for critic in (sep, shared):
        ids = torch.cat([g.prompt_ids, g.completion_ids], 1)
        attn = torch.cat([g.prompt_mask, g.completion_mask], 1)
        assert critic(ids, attn, attn.cumsum(-1) - 1).shape == ids.shape  # (B, P+T)
        torch.nn.init.normal_(critic.head.weight)
        logps, ents, values = ppo_lm.logps_values(model, critic, *args)
        assert logps.shape == ents.shape == values.shape == (B, T)
        assert torch.allclose(logps, ref_logps, atol=1e-5)
        assert torch.allclose(ents, ref_ents, atol=1e-5)
        assert (values[g.completion_mask == 0] == 0).all()
        assert torch.allclose(values, ppo_lm.rollout_values(critic, *args), atol=1e-5)
        nn_zero = ppo_lm.make_value_model(model, "separate")
        assert (ppo_lm.rollout_values(nn_zero, *args) == 0).all()  # the head starts at zero


def _batch(model, tok, critic, n=4, seed=0):
    g = generate(model, tok, chat(tok, ["1+2=", "33*4=", "5-7=", "9*9="][:n]), max_new_tokens=4,
                 generator=torch.Generator().manual_seed(seed))
    args = (g.prompt_ids, g.prompt_mask, g.completion_ids, g.completion_mask)
    values = ppo_lm.rollout_values(critic, *args)
    r = ppo_lm.token_rewards(torch.tensor([1.0, 0.0, 1.0, 0.0][:n]), g.completion_mask)
    adv, ret = ppo_lm.token_gae(r, values, g.completion_mask)
    return {"prompt_ids": g.prompt_ids, "prompt_mask": g.prompt_mask,
            "completion_ids": g.completion_ids, "completion_mask": g.completion_mask,
            "logps": g.logps, "values": values,
            "advantages": ppo_lm.whiten_advantages(adv, g.completion_mask),
            "returns": ret}


@pytest.mark.parametrize("kind", ["separate", "shared"])
def test_one_update_changes_policy_and_value(tiny_lm, kind):
    model, tok = tiny_lm
    critic = ppo_lm.make_value_model(model, kind)
    cfg = PPOLMConfig(critic=kind, num_epochs=2, num_minibatches=2, num_prompts=4, lr=1e-2)
    batch = _batch(model, tok, critic)
    before_pol = [p.detach().clone() for p in model.parameters()]
    crit_params = ppo_lm.critic_parameters(model, critic)
    before_crit = [p.detach().clone() for p in crit_params]
    opt = torch.optim.AdamW(list(model.parameters()) + crit_params, lr=cfg.lr)
    m = ppo_lm.ppo_update(model, critic, opt, batch, cfg, torch.Generator().manual_seed(0))
    assert {f"losses/{k}" for k in ("loss", "policy_loss", "value_loss", "clipfrac", "approx_kl",
                                    "entropy")} <= set(m)
    assert any(not torch.equal(a, b) for a, b in zip(before_pol, model.parameters()))
    assert not torch.equal(before_crit[-2], critic.head.weight)  # the head moved
    if kind == "separate":
        # the critic trunk moves too (after the first step: the zero head passes no gradient),
        # and the policy's parameters are not the critic's
        assert any(not torch.equal(a, b) for a, b in zip(before_crit[:-2], crit_params[:-2]))
        assert not any(p is q for p in model.parameters() for q in crit_params)


def test_config_errors(tiny_lm):
    with pytest.raises(ValueError, match="unknown critic"):
        PPOLMConfig(critic="twin")
    with pytest.raises(ValueError, match="must divide"):
        PPOLMConfig(num_prompts=6, num_minibatches=4)
    for bad in ({"gamma": 1.5}, {"lam": -0.1}, {"beta": -1.0}, {"clip_eps": 0.0},
                {"num_epochs": 0}, {"group_size": 0}, {"lr": 0.0}, {"temperature": 0.0}):
        with pytest.raises(ValueError, match="PPOLMConfig"):
            PPOLMConfig(**bad)
    with pytest.raises(ValueError, match="kl_estimator"):
        PPOLMConfig(kl_estimator="k4")
    with pytest.raises(ValueError, match="unknown critic"):
        ppo_lm.make_value_model(tiny_lm[0], "twin")
    model, tok = tiny_lm
    probs = [{"prompt": "1+1=", "answer": "2"}]
    zero = [lambda c, **k: [0.0] * len(c)]
    cfg = PPOLMConfig(num_prompts=1, num_iters=1)
    with pytest.raises(ValueError, match="shares"):
        ppo_lm.train(model, grpo.completion_sampler(tok, probs, zero, cfg), cfg,
                     critic=ppo_lm.make_value_model(model, "shared"))
    with pytest.raises(ValueError, match="num_prompts=2 is more than the 1 training problems"):
        grpo.completion_sampler(tok, probs, zero, PPOLMConfig(num_prompts=2))


# --- the loop ---------------------------------------------------------------------------------
def odd_length(completions, **kwargs):
    return [float(len(c) % 2) for c in completions]


def test_train_rows_match_grpo_interface():
    problems = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(10) for b in range(10)]
    panel = problems[:6]
    runs = {}
    for name in ("ppo", "grpo"):
        model, tok = new_model("tiny-64", seed=0)
        evaluate = lambda m: grpo.evaluate(m, tok, panel, odd_length, 4)  # noqa: E731
        if name == "ppo":
            cfg = PPOLMConfig(num_prompts=4, group_size=2, num_iters=2, max_new_tokens=4,
                              num_epochs=2, eval_every=1, seed=3, critic_lr=1e-2)
            critic = ppo_lm.make_value_model(model, "separate")
            sample = grpo.completion_sampler(tok, problems, [odd_length], cfg)
            runs[name] = ppo_lm.train(model, sample, cfg, evaluate, critic=critic)
            assert critic.head.weight.abs().sum() > 0  # the loop trains the critic it was given
        else:
            cfg = grpo.preset("grpo", num_prompts=4, group_size=2, num_iters=2, max_new_tokens=4,
                              eval_every=1, seed=3)
            sample = grpo.completion_sampler(tok, problems, [odd_length], cfg)
            runs[name] = grpo.train(model, sample, cfg, evaluate)
    ppo_rows, grpo_rows = runs["ppo"], runs["grpo"]
    assert [r["iter"] for r in ppo_rows] == [0, 1, 2] and "eval/acc" in ppo_rows[-1]
    assert [r["iter"] for r in grpo_rows] == [0, 1, 2] and "eval/acc" in grpo_rows[0]
    for key in ("rollout/reward", "time/step_s", "time/gen_s", "rollout/completion_len",
                "eval/acc", "losses/loss", "losses/entropy", "losses/clipfrac"):
        assert key in ppo_rows[1] and key in grpo_rows[1]
    for key in ("losses/explained_variance", "losses/value_loss", "losses/policy_loss",
                "losses/value_mean"):
        assert key in ppo_rows[1]
    # same seed, prompts and group size: the first batch of samples is the same
    assert ppo_rows[1]["rollout/reward"] == grpo_rows[1]["rollout/reward"]
    assert ppo_rows[1]["rollout/completion_len"] == grpo_rows[1]["rollout/completion_len"]


def test_optimizer_groups(tiny_lm):
    model, _ = tiny_lm
    for kind, n_own in (("separate", None), ("shared", model.config.hidden_size + 1)):
        critic = ppo_lm.make_value_model(model, kind)
        cfg = PPOLMConfig(critic=kind, lr=1e-4, critic_lr=1e-3)
        opt = ppo_lm.make_optimizer(model, critic, cfg)
        pol, crit = opt.param_groups
        assert (pol["lr"], crit["lr"]) == (1e-4, 1e-3)
        assert sum(p.numel() for p in pol["params"]) == sum(p.numel() for p in model.parameters())
        n_crit = sum(p.numel() for p in crit["params"])
        assert n_crit == (n_own or sum(p.numel() for p in critic.parameters()))
    opt = ppo_lm.make_optimizer(model, critic, PPOLMConfig(critic="shared", lr=3e-4))
    assert opt.param_groups[1]["lr"] == 3e-4  # critic_lr None: the policy's rate
