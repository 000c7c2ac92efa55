"""The GRPO family loss: hand-computed values, and equality with TRL's GRPOTrainer loss; the one
loop on single-turn completions (its multi-turn use is in test_lm_rollout.py)."""

import math
from collections import defaultdict
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from agentrl_lib import core
from agentrl_lib.algorithms import grpo
from agentrl_lib.algorithms.grpo import GRPOConfig, policy_loss, preset
from agentrl_lib.core import group_advantages


def test_advantages_by_hand():
    r = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    assert torch.allclose(group_advantages(r, "reinforce"), r)
    assert torch.allclose(group_advantages(r, "batch_mean"), r - 0.75)
    assert torch.allclose(group_advantages(r, "rloo"), torch.tensor([[1.0, -1.0], [0.0, 0.0]]))
    g = group_advantages(r, "grpo")
    assert torch.allclose(g, torch.tensor([[0.5, -0.5], [0.0, 0.0]]) / (math.sqrt(0.5) + 1e-4))
    assert torch.allclose(group_advantages(r, "dr_grpo"), torch.tensor([[0.5, -0.5], [0.0, 0.0]]))
    # Lite-PPO: group mean, *batch* std (of all four rewards: std([1, 0, 1, 1], ddof=1) = 0.5)
    lite = group_advantages(r, "lite_ppo")
    assert torch.allclose(lite, torch.tensor([[0.5, -0.5], [0.0, 0.0]]) / 0.5001)


def test_aggregations_by_hand():
    logps = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]])
    adv = torch.tensor([1.0, -2.0])
    # ratio 1 everywhere: per-token loss is -A on live tokens
    seq = policy_loss(logps, logps, adv, mask, GRPOConfig(loss_agg="seq_mean"))[0]
    assert math.isclose(seq.item(), ((-1.0) + 2.0) / 2)  # each sequence's mean, then the mean
    tok = policy_loss(logps, logps, adv, mask, GRPOConfig(loss_agg="token_mean"))[0]
    assert math.isclose(tok.item(), (-3.0 + 2.0) / 4)
    const = policy_loss(logps, logps, adv, mask, GRPOConfig(loss_agg="const_norm"), max_len=5)[0]
    assert math.isclose(const.item(), (-3.0 + 2.0) / (2 * 5), rel_tol=1e-6)


def test_clip_higher_and_ratio():
    old = torch.zeros(1, 2)
    logps = torch.log(torch.tensor([[1.5, 0.5]]))
    adv = torch.tensor([1.0])
    loss, m = policy_loss(logps, old, adv, torch.ones(1, 2), GRPOConfig(loss_agg="token_mean"))
    assert math.isclose(loss.item(), -(1.2 + 0.5) / 2, rel_tol=1e-6) and m["clipfrac"] == 0.5
    loss_hi, _ = policy_loss(logps, old, adv, torch.ones(1, 2),
                             GRPOConfig(loss_agg="token_mean", clip_eps_high=0.28))
    assert math.isclose(loss_hi.item(), -(1.28 + 0.5) / 2, rel_tol=1e-6)


def test_config_errors():
    with pytest.raises(ValueError, match="unknown estimator 'ppo'"):
        GRPOConfig(estimator="ppo")
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        GRPOConfig(estimator="rloo", group_size=1)
    with pytest.raises(ValueError, match="unknown loss_agg"):
        GRPOConfig(loss_agg="sum")
    with pytest.raises(ValueError, match="unknown preset"):
        preset("trpo")
    with pytest.raises(ValueError, match="unknown is_level 'turn'.*'token', 'sequence'"):
        GRPOConfig(is_level="turn")
    with pytest.raises(ValueError, match="unknown clip 'dual'.*'ppo', 'cispo'"):
        GRPOConfig(clip="dual")
    with pytest.raises(ValueError, match="clip_eps must be > 0, got -0.1"):
        GRPOConfig(clip_eps=-0.1)
    with pytest.raises(ValueError, match="clip_eps must be > 0, got nan"):
        GRPOConfig(clip_eps=float("nan"))
    with pytest.raises(ValueError, match="clip_eps_high must be > 0 or None, got 0.0"):
        GRPOConfig(clip_eps_high=0.0)
    with pytest.raises(ValueError, match="unknown estimator 'reinforce\\+\\+'.*'reinforce_pp'"):
        GRPOConfig(estimator="reinforce++")
    with pytest.raises(ValueError, match="unknown is_level"):
        preset("gspo", is_level="seq")  # overrides are checked too
    GRPOConfig(estimator="reinforce_pp", group_size=1)  # batch-level: no group needed
    with pytest.raises(ValueError, match="needs group_size >= 2"):
        GRPOConfig(estimator="lite_ppo", group_size=1)
    with pytest.raises(ValueError, match="needs ref_logps"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1),
                    GRPOConfig(beta=0.1))


def test_presets_matrix():
    m = grpo.matrix()
    assert list(m) == ["reinforce", "rloo", "grpo", "dr_grpo", "dapo", "lite_ppo",
                       "lite_ppo_plain", "reinforce_pp", "gspo", "cispo"]
    cols = ("mean_level", "std_level", "leave_one_out", "is_level", "clip", "clip_eps",
            "clip_eps_high", "loss_agg")
    want = {  # the papers' choices (grpo.py's docstring says which are inferred)
        "reinforce": ("batch", "none", False, "token", "ppo", 0.2, None, "seq_mean"),
        "rloo": ("group", "none", True, "token", "ppo", 0.2, None, "seq_mean"),
        "grpo": ("group", "group", False, "token", "ppo", 0.2, None, "seq_mean"),
        "dr_grpo": ("group", "none", False, "token", "ppo", 0.2, None, "const_norm"),
        "dapo": ("group", "group", False, "token", "ppo", 0.2, 0.28, "token_mean"),
        "lite_ppo": ("group", "batch", False, "token", "ppo", 0.2, None, "token_mean"),
        "lite_ppo_plain": ("group", "batch", False, "token", "ppo", 0.2, None, "token_mean"),
        "reinforce_pp": ("batch", "batch", False, "token", "ppo", 0.2, None, "token_mean"),
        "gspo": ("group", "group", False, "sequence", "ppo", 3e-4, 4e-4, "seq_mean"),
        "cispo": ("group", "group", False, "token", "cispo", 1.0, 4.0, "token_mean"),
    }
    for name, row in m.items():
        assert tuple(row[c] for c in cols) == want[name], name
        assert row["dynamic_sampling"] == (name == "dapo")
        assert row["max_num_gen_batches"] == (10 if name == "dapo" else 1)  # verl's DAPO recipe
        roll = name == "lite_ppo"  # ROLL's LitePPO config (docs "LitePPO")
        assert (row["beta"], row["whiten_adv"], row["adv_clip"], row["dual_clip"]) == \
            ((0.001, True, 2.0, 1.4) if roll else (0.0, False, None, None)), name
    # every row is a preset: its estimator and loss fields are the config's
    for name, row in m.items():
        cfg = preset(name)
        assert all(row[f] == getattr(cfg, f) for f in grpo.MATRIX_FIELDS), name
    # the existing presets are the configs they were before the matrix (commit bff38d9), but for
    # issue 27's fidelity fixes: DAPO refills (verl), Lite-PPO is ROLL's config ('_plain': before)
    assert preset("dapo", max_num_gen_batches=1) == GRPOConfig(
        estimator="grpo", loss_agg="token_mean", clip_eps_high=0.28, dynamic_sampling=True,
        overlong_buffer=2)
    assert preset("lite_ppo_plain") == GRPOConfig(estimator="lite_ppo", loss_agg="token_mean")
    assert preset("reinforce", lr=0.5) == GRPOConfig(estimator="batch_mean", lr=0.5)


def _old_policy_loss(logps, old_logps, advantages, mask, cfg, ref_logps=None, max_len=None):
    """``policy_loss`` as it was before the is_level and clip knobs (commit bff38d9), frozen."""
    adv = advantages[:, None] if advantages.dim() == 1 and logps.dim() == 2 else advantages
    eps_high = cfg.clip_eps if cfg.clip_eps_high is None else cfg.clip_eps_high
    ratio = torch.exp(logps - old_logps)
    clipped_ratio = torch.clamp(ratio, 1.0 - cfg.clip_eps, 1.0 + eps_high)
    per_token = -torch.minimum(ratio * adv, clipped_ratio * adv)
    if cfg.beta != 0.0:
        per_token = per_token + cfg.beta * core.kl_estimate(logps, ref_logps, cfg.kl_estimator)
    loss = core.aggregate(per_token, mask, cfg.loss_agg, max_len)
    with torch.no_grad():
        adv = adv.expand_as(ratio)
        low, high = ratio < 1.0 - cfg.clip_eps, ratio > 1.0 + eps_high
        clipped = (low & (adv < 0)) | (high & (adv > 0))
        m = mask.to(ratio.dtype)
        clipfrac = core.masked_mean(clipped.to(ratio.dtype), m).item()
        approx_kl = core.masked_mean((ratio - 1.0) - (logps - old_logps), m).item()
    return loss, clipfrac, approx_kl


def _bits(x):
    return x.contiguous().view(torch.int64 if x.dtype == torch.float64 else torch.int32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_existing_presets_are_bitwise_unchanged(dtype):
    g = torch.Generator().manual_seed(3)
    B, T = 6, 5
    logps = -torch.rand(B, T, generator=g, dtype=dtype)
    old = logps + 0.6 * torch.randn(B, T, generator=g, dtype=dtype)
    ref = logps + 0.2 * torch.randn(B, T, generator=g, dtype=dtype)
    mask = (torch.rand(B, T, generator=g) < 0.7).long()
    mask[:, 0], mask[-1] = 1, 0  # and one empty row
    clipfracs = []
    advs = (torch.randn(B, generator=g, dtype=dtype), torch.randn(B, T, generator=g, dtype=dtype))
    for adv in advs:
        for name in ("reinforce", "rloo", "grpo", "dr_grpo", "dapo", "lite_ppo_plain"):
            for beta in (0.0, 0.04):
                cfg = preset(name, beta=beta)
                lp_new = logps.clone().requires_grad_(True)
                lp_old = logps.clone().requires_grad_(True)
                new, m = policy_loss(lp_new, old, adv, mask, cfg, ref, max_len=7)
                want, clipfrac, approx_kl = _old_policy_loss(lp_old, old, adv, mask, cfg, ref, 7)
                (g_new,) = torch.autograd.grad(new, lp_new)
                (g_old,) = torch.autograd.grad(want, lp_old)
                assert torch.equal(_bits(new), _bits(want))
                assert torch.equal(_bits(g_new), _bits(g_old))
                assert (m["clipfrac"], m["approx_kl"]) == (clipfrac, approx_kl)
                clipfracs.append(clipfrac)
    assert len(clipfracs) == 24 and sum(c > 0 for c in clipfracs) >= 20  # the clip is exercised


# --- equality with TRL ---------------------------------------------------------------------------
def trl_loss(loss_type, logps, old_logps, ref_logps, advantages, mask, beta, eps, eps_high, max_len,
             importance_sampling_level="token"):
    """Run TRL's own GRPOTrainer._compute_loss on our tensors (a stand-in object supplies the
    attributes it reads; its log-prob function returns our ``logps``)."""
    from trl import GRPOTrainer

    class Acc:
        num_processes, sync_gradients = 1, True
        gather = gather_for_metrics = staticmethod(lambda x: x)
        reduce = staticmethod(lambda x, reduction="sum": x)

    fake = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None,
        importance_sampling_level=importance_sampling_level,
        beta=beta, loss_type=loss_type, epsilon_low=eps, epsilon_high=eps_high, use_vllm=False,
        vllm_importance_sampling_correction=False, model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1, max_completion_length=max_len, accelerator=Acc(),
        aux_loss_enabled=False, _entropy_bonus_enabled=False, use_adaptive_entropy=False,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        args=SimpleNamespace(use_bias_correction_kl=False, delta=None, steps_per_generation=1),
        _get_per_token_logps_and_entropies=lambda *a, **k: (logps, torch.zeros_like(logps), None),
    )
    inputs = {"prompt_ids": torch.zeros(logps.shape[0], 1, dtype=torch.long),
              "prompt_mask": torch.ones(logps.shape[0], 1, dtype=torch.long),
              "completion_ids": torch.zeros_like(mask), "completion_mask": mask,
              "advantages": advantages, "old_per_token_logps": old_logps,
              "ref_per_token_logps": ref_logps, "num_items_in_batch": mask.sum()}
    return GRPOTrainer._compute_loss(fake, None, inputs)


def _trl_inputs(adv_per_token=False):
    g = torch.Generator().manual_seed(1)
    B, T = 6, 5
    logps = -torch.rand(B, T, generator=g, dtype=torch.float64)
    old = logps + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios far from 1
    ref = logps + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) < 0.7).long()
    mask[:, 0] = 1
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    if adv_per_token:
        adv = torch.randn(B, T, generator=g, dtype=torch.float64)
    return logps.requires_grad_(True), old, ref, mask, adv


def _ours_and_trl(cfg, trl_type, is_level, adv_per_token, trl_eps_high):
    """(ours, TRL's) losses and their gradients with respect to the same logps."""
    logps, old, ref, mask, adv = _trl_inputs(adv_per_token)
    ours, _ = policy_loss(logps, old, adv, mask, cfg, ref, max_len=7)
    theirs = trl_loss(trl_type, logps, old, ref, adv, mask, cfg.beta, cfg.clip_eps, trl_eps_high, 7,
                      importance_sampling_level=is_level)
    (g_ours,), (g_theirs,) = torch.autograd.grad(ours, logps), torch.autograd.grad(theirs, logps)
    return ours, theirs, g_ours, g_theirs


@pytest.mark.parametrize("trl_type,agg", [("grpo", "seq_mean"), ("bnpo", "token_mean"),
                                          ("dapo", "token_mean"), ("dr_grpo", "const_norm")])
@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("is_level", ["token", "sequence"])  # sequence: GSPO
@pytest.mark.parametrize("adv_per_token", [False, True])
def test_loss_equals_trl(trl_type, agg, beta, is_level, adv_per_token):
    pytest.importorskip("trl")
    cfg = GRPOConfig(loss_agg=agg, beta=beta, clip_eps=0.2, clip_eps_high=0.28, is_level=is_level)
    ours, theirs, g_ours, g_theirs = _ours_and_trl(cfg, trl_type, is_level, adv_per_token, 0.28)
    assert torch.allclose(ours, theirs, atol=1e-12, rtol=0), (ours.item(), theirs.item())
    assert torch.allclose(g_ours, g_theirs, atol=1e-12, rtol=0)
    # control: the other ratio level is a different loss on these inputs (by far more than atol)
    other = replace(cfg, is_level="token" if is_level == "sequence" else "sequence")
    logps, old, ref, mask, adv = _trl_inputs(adv_per_token)
    assert (policy_loss(logps, old, adv, mask, other, ref, max_len=7)[0] - theirs).abs() > 1e-6


@pytest.mark.parametrize("beta", [0.0, 0.04])
@pytest.mark.parametrize("is_level", ["token", "sequence"])
@pytest.mark.parametrize("adv_per_token", [False, True])
def test_cispo_equals_trl(beta, is_level, adv_per_token):
    """TRL's loss_type='cispo' caps rho at epsilon_high with no lower bound and normalises by the
    batch's tokens: ours with clip='cispo', token_mean, clip_eps=1 (a lower bound of 0) and
    clip_eps_high = epsilon_high - 1."""
    pytest.importorskip("trl")
    # a tight cap (1.05): the sequence-level ratios of these inputs are near 1
    cfg = GRPOConfig(loss_agg="token_mean", clip="cispo", beta=beta, clip_eps=1.0,
                     clip_eps_high=0.05, is_level=is_level)
    ours, theirs, g_ours, g_theirs = _ours_and_trl(cfg, "cispo", is_level, adv_per_token, 1.05)
    assert torch.allclose(ours, theirs, atol=1e-12, rtol=0), (ours.item(), theirs.item())
    assert torch.allclose(g_ours, g_theirs, atol=1e-12, rtol=0)
    # controls: the cap must bind on these inputs, and a lower bound (which TRL lacks) changes it
    logps, old, ref, mask, adv = _trl_inputs(adv_per_token)
    assert policy_loss(logps, old, adv, mask, cfg, ref)[1]["clipfrac"] > 0.1
    uncapped = replace(cfg, clip_eps_high=10.0)
    assert (policy_loss(logps, old, adv, mask, uncapped, ref)[0] - theirs).abs() > 1e-6
    low = replace(cfg, clip_eps=0.2)
    assert (policy_loss(logps, old, adv, mask, low, ref)[0] - theirs).abs() > 1e-6


def test_one_update_changes_parameters_and_dynamic_sampling():
    from agentrl_lib.envs.text_tasks import make_problems
    from agentrl_lib.models.tiny_lm import new_model

    model, tok = new_model("tiny-64", seed=0)
    before = [p.detach().clone() for p in model.parameters()]
    probs = make_problems("arithmetic", 20, 1)
    cfg = GRPOConfig(num_prompts=4, group_size=4, num_iters=1, max_new_tokens=4,
                     estimator="reinforce", eval_every=100)
    always_one = lambda completions, **kw: [1.0] * len(completions)  # noqa: E731
    rows = grpo.train(model, grpo.completion_sampler(tok, probs, [always_one], cfg), cfg)
    changed = any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert changed and rows[0]["rollout/reward"] == 1.0 and "losses/loss" in rows[0]
    # all-equal rewards and dynamic sampling: every group is dropped, nothing changes; 0.7 is the
    # float32 trap (its group std is about 6e-8, not 0), so a `std > 0` test would keep the groups
    for value in (1.0, 0.7):
        before = [p.detach().clone() for p in model.parameters()]
        cfg = GRPOConfig(num_prompts=4, group_size=4, num_iters=1, max_new_tokens=4,
                         dynamic_sampling=True)
        const = lambda completions, v=value, **kw: [v] * len(completions)  # noqa: E731
        rows = grpo.train(model, grpo.completion_sampler(tok, probs, [const], cfg), cfg)
        assert rows[0]["rollout/kept_frac"] == 0.0 and "losses/loss" not in rows[0], value
        assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_train_stops_when_stop_says_so(tiny_lm):
    """``stop(row)`` ends training after that update (a budget, here of completions), evaluated
    then; without it the loop runs ``num_iters``."""
    from agentrl_lib.envs.text_tasks import make_problems

    model, tok = tiny_lm
    probs = make_problems("arithmetic", 20, 1)
    cfg = GRPOConfig(num_prompts=2, group_size=2, num_iters=50, max_new_tokens=3, eval_every=100)
    one = lambda completions, **kw: [1.0] * len(completions)  # noqa: E731
    paid = []

    def spent(row):  # 4 completions an update: the budget 10 is reached at the third
        paid.append(4)
        return sum(paid) >= 10

    rows = grpo.train(model, grpo.completion_sampler(tok, probs, [one], cfg), cfg,
                      evaluate=lambda m: {"n": 1.0}, stop=spent)
    assert [r["iter"] for r in rows] == [0, 1, 2, 3] and "eval/n" in rows[-1]
    assert "eval/n" not in rows[1]


def test_evaluate_samples_k_completions_with_seeded_draws(tiny_lm):
    """``evaluate(samples=k)`` scores k sampled completions of every problem, the same draws at
    every call with one seed and other draws with another; ``samples=0`` is one greedy each."""
    model, tok = tiny_lm
    probs = [{"prompt": f"{a}+{b}=", "answer": str(a + b)} for a in range(3) for b in range(2)]
    seen = []

    def record(completions, **kwargs):
        seen.append(list(completions))
        return [float(len(c) % 2) for c in completions]

    a = grpo.evaluate(model, tok, probs, record, 6, samples=3, seed=5)
    b = grpo.evaluate(model, tok, probs, record, 6, samples=3, seed=5)
    grpo.evaluate(model, tok, probs, record, 6, samples=3, seed=6)
    assert len(seen[0]) == 3 * len(probs) and a == b and seen[0] == seen[1]
    assert seen[2] != seen[0]
    assert a["acc"] == sum(len(c) % 2 for c in seen[0]) / len(seen[0])
    grpo.evaluate(model, tok, probs + probs, record, 6)  # greedy: a problem's twins agree
    assert len(seen[3]) == 2 * len(probs) and seen[3][:len(probs)] == seen[3][len(probs):]


# --- issue 27: Lite-PPO as ROLL runs it, DAPO's refill as verl runs it ---------------------------
def test_lite_ppo_preset_is_rolls_loss_by_hand():
    """``preset('lite_ppo')``: ROLL's reward_norm (group mean, batch std), compute_advantage
    (masked_whiten, clamp 2) and ActorWorker.loss_func (token-mean of the dual-clipped PPO loss
    with c = 1 + 2 * 0.2, plus 0.001 x the token-mean of k3 to the reference), written out here."""
    from agentrl_lib.rollout import Generation

    g = torch.Generator().manual_seed(7)
    B, G, T = 2, 3, 4
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])  # group 2 all right
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0],
                         [1, 1, 1, 0]])
    old = -torch.rand(B * G, T, generator=g) * mask
    logps = old + 0.5 * torch.randn(B * G, T, generator=g) * mask  # ratios far from 1
    ref = old + 0.3 * torch.randn(B * G, T, generator=g) * mask
    cfg = preset("lite_ppo", group_size=G, num_prompts=B)
    ids = torch.ones(B * G, 1, dtype=torch.long)
    gen = Generation(ids, ids, torch.ones(B * G, T, dtype=torch.long), mask, old)
    batch = grpo.advantages(grpo.Batch(gen, rewards), cfg)
    # ROLL by hand: reward_norm, then the token-level return (gamma 1), masked_whiten, clamp
    r = rewards.view(B, G)
    a = ((r - r.mean(-1, keepdim=True)) / (rewards.std() + 1e-6)).reshape(-1)  # ROLL's eps 1e-6
    tok = a[:, None] * mask
    n = mask.sum()
    mu = tok.sum() / n
    var = ((tok - mu) ** 2 * mask).sum() / n * (n / (n - 1))
    adv = ((tok - mu) * torch.rsqrt(var + 1e-8) * mask).clamp(-2.0, 2.0)
    # ROLL's std eps is 1e-6, ours 1e-4: the whitening undoes any scale, so they agree
    assert torch.allclose(batch.advantages, adv, atol=1e-5)
    assert batch.advantages[3:].abs().sum() > 0  # the all-right group moves after whitening
    ratio = torch.exp(logps - old)
    loss = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    loss = torch.where(adv < 0, -torch.max(-loss, (1 + 0.2 * 2) * adv), loss)
    kl = torch.exp(ref - logps) - (ref - logps) - 1  # k3, ROLL's compute_approx_kl
    want = (loss * mask).sum() / n + 0.001 * (kl * mask).sum() / n
    got, m = policy_loss(logps, old, batch.advantages, mask, cfg, ref)
    assert torch.allclose(got, want, atol=1e-5) and m["kl"] > 0
    assert ((adv < 0) & (ratio > 1.4) & (mask > 0)).any()  # the dual clip acts here


def test_refill_sampler_as_verl(tiny_lm):
    """DAPO's refill (verl ``RayDAPOTrainer.fit``): rounds of num_prompts prompts until num_prompts
    informative groups are in hand, the first of them kept; the rounds, the budget and the rows
    against the same seeded draws by hand. The reward makes a group informative exactly when its
    answer is a multiple of 3."""
    import random

    from agentrl_lib.envs.text_tasks import make_problems
    from agentrl_lib.rollout import concat_generations, generation_logps

    model, tok = tiny_lm
    probs = make_problems("arithmetic", 40, 1)
    informative = lambda p: int(p["answer"]) % 3 == 0  # noqa: E731

    def rew(completions, answer, **kw):
        return [float(i % 2) if int(a) % 3 == 0 else 0.0 for i, a in enumerate(answer)]
    for max_groups, refill in ((None, 10), (8, 10), (None, 1)):
        cfg = GRPOConfig(num_prompts=4, group_size=2, max_new_tokens=2, dynamic_sampling=True,
                         max_num_gen_batches=refill, max_groups=max_groups)
        batch = grpo.completion_sampler(tok, probs, [rew], cfg)(model)
        rng, kept, rounds = random.Random(cfg.seed), [], 0
        while True:
            rounds += 1
            kept += [p for p in rng.sample(probs, 4) if informative(p)]
            if refill == 1 or len(kept) >= 4 or rounds == refill or rounds * 4 + 4 > (
                    max_groups or 10**9):
                break
        assert batch.metrics["rollout/gen_batches"] == rounds
        assert rounds > 1 if refill > 1 else rounds == 1
        assert batch.metrics["samples"] == rounds * 4 * 2
        if refill > 1:
            kept = kept[:4]
            assert batch.rewards.tolist() == [0.0, 1.0] * len(kept)
            prompts = tok.batch_decode(batch.seqs.prompt_ids, skip_special_tokens=True)
            assert all(p["prompt"] in prompts[2 * i] for i, p in enumerate(kept))
        else:  # no refill: the round as drawn; advantages() drops its all-equal groups
            assert batch.rewards.numel() == 8
    # concatenated rounds score as they did apart (the extra left padding changes nothing)
    gens = [grpo.completion_sampler(tok, probs, [rew], replace(cfg, seed=s, max_new_tokens=3 - s))(
        model).seqs for s in (0, 1)]
    both = concat_generations(gens, tok.pad_token_id)
    with torch.no_grad():
        lp_both, _ = generation_logps(model, both)
        for i, g in enumerate(gens):
            lp, _ = generation_logps(model, g)
            rows = slice(8 * i, 8 * (i + 1))
            assert torch.allclose(lp_both[rows, :lp.shape[1]], lp, atol=1e-5)
            assert torch.equal(both.completion_mask[rows, :lp.shape[1]], g.completion_mask)


def test_kl_in_reward_is_verls_penalty_before_the_advantage():
    """``kl_in_reward``: verl's apply_kl_penalty (k1, beta per token) summed into each completion's
    score, then GRPO's group normalisation (verl's eps 1e-6); the loss then carries no KL term.
    Two groups of two, worked out by hand: group 0's task rewards differ, group 1's are equal, so
    without the KL its advantages would be 0 and with it they are +-1/sqrt(2) (the KL's sign)."""
    from agentrl_lib.rollout import Generation

    lp = torch.tensor([[-0.2, -1.0], [-0.4, -0.6], [-1.0, -3.0], [-0.5, -0.5]])
    ref = torch.tensor([[-0.3, -1.0], [-0.4, -0.2], [-1.0, -1.0], [-0.5, -0.5]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0], [1, 1]])
    g = Generation(torch.zeros(4, 1, dtype=torch.long), torch.ones(4, 1), torch.zeros(4, 2,
                   dtype=torch.long), mask, lp * mask)
    batch = grpo.Batch(seqs=g, rewards=torch.tensor([1.0, 0.0, 0.0, 0.0]))
    cfg = GRPOConfig(num_prompts=2, group_size=2, beta=0.1, kl_estimator="k1",
                     kl_in_reward=True, adv_eps=1e-6)
    out = grpo.advantages(batch, cfg, ref_logps=ref)
    # sum_t k1: row 0: 0.1 + 0; row 1: 0 - 0.4; row 2: 0 (the masked token left out); row 3: 0
    s = [1.0 - 0.01, 0.0 + 0.04, 0.0, 0.0]
    sd0 = abs(s[0] - s[1]) / math.sqrt(2)  # the std (ddof 1) of two numbers
    a0 = (s[0] - s[1]) / 2 / (sd0 + 1e-6)
    assert torch.allclose(out.advantages, torch.tensor([a0, -a0, 0.0, 0.0]), atol=1e-5)
    ref2 = ref.clone()
    ref2[3] = torch.tensor([-0.5, -0.7])  # row 3's k1 sum 0.2: group 1 now differs by the KL only
    out = grpo.advantages(batch, cfg, ref_logps=ref2)
    a1 = 0.5 * 0.02 / (0.02 / math.sqrt(2) + 1e-6)
    assert torch.allclose(out.advantages[2:], torch.tensor([a1, -a1]), atol=1e-4)
    assert math.isclose(out.metrics["rollout/kl"], (0.1 - 0.4 + 0.2) / 7, rel_tol=1e-5)
    off = grpo.advantages(batch, replace(cfg, kl_in_reward=False), ref_logps=ref2)
    assert torch.equal(off.advantages[2:], torch.zeros(2))
    with pytest.raises(ValueError, match="needs ref_logps"):
        grpo.advantages(batch, cfg)
    # the loss has no KL term with kl_in_reward (beta 0's loss), and has one without it
    new = lp + 0.1
    adv = torch.tensor([1.0, -1.0, 0.5, 0.0])
    l_reward, m = policy_loss(new, lp, adv, mask, cfg, ref)
    l_none, _ = policy_loss(new, lp, adv, mask, replace(cfg, beta=0.0, kl_in_reward=False))
    l_loss, _ = policy_loss(new, lp, adv, mask, replace(cfg, kl_in_reward=False), ref)
    assert l_reward.item() == l_none.item() and "kl" not in m
    assert not math.isclose(l_loss.item(), l_none.item())
    with pytest.raises(ValueError, match="unknown kl_estimator"):
        GRPOConfig(kl_estimator="k4")


def test_train_makes_the_frozen_start_its_reference(tiny_lm):
    """beta != 0 and no ref_model: ``train`` copies the start (``make_reference``), so the KL is 0
    at the first update (the policy is the reference) and > 0 once the policy moved; the copy
    stays the start. Both placements; ``ref_model is model`` is refused."""
    from agentrl_lib.envs.text_tasks import make_problems

    model, tok = tiny_lm
    start = [p.detach().clone() for p in model.parameters()]
    probs = make_problems("arithmetic", 20, 1)
    distinct = lambda completions, **kw: [float(len(set(c))) for c in completions]  # noqa: E731
    for in_reward, key in ((True, "rollout/kl"), (False, "losses/kl")):
        m = __import__("copy").deepcopy(model)
        cfg = GRPOConfig(num_prompts=2, group_size=4, num_iters=2, max_new_tokens=4, lr=0.05,
                         beta=0.01, kl_estimator="k1" if in_reward else "low_var_kl",
                         kl_in_reward=in_reward, eval_every=100)
        rows = grpo.train(m, grpo.completion_sampler(tok, probs, [distinct], cfg), cfg)
        kls = [r[key] for r in rows]  # one row per update (no evaluation at 0)
        assert abs(kls[0]) < 1e-5 and abs(kls[-1]) > 1e-4, (in_reward, kls)
    assert all(torch.equal(a, b) for a, b in zip(start, model.parameters()))
    with pytest.raises(ValueError, match="same object"):
        grpo.train(model, None, GRPOConfig(beta=0.1), ref_model=model)
    ref = grpo.make_reference(model)
    assert not ref.training and not any(p.requires_grad for p in ref.parameters())


def test_entropy_bonus_is_verls_token_mean(tiny_lm):
    """entropy_coef: the loss is the one without it minus entropy_coef x the token mean of the
    temperature-scaled entropy over the loss mask (verl's ``pg_loss - agg_loss(entropy,
    response_mask, 'token-mean') * entropy_coeff``), written out here from the logits."""
    import copy

    import torch.nn.functional as F

    from agentrl_lib.envs.text_tasks import make_problems

    model, tok = tiny_lm
    probs = make_problems("arithmetic", 20, 1)
    distinct = lambda completions, **kw: [float(len(set(c))) for c in completions]  # noqa: E731
    base = GRPOConfig(num_prompts=2, group_size=4, num_iters=1, max_new_tokens=5,
                      loss_agg="token_mean", temperature=0.7, eval_every=100)
    batch = grpo.advantages(grpo.completion_sampler(tok, probs, [distinct], base)(model), base)
    g = batch.seqs
    with torch.no_grad():
        ids = torch.cat([g.prompt_ids, g.completion_ids], 1)
        logits = model(input_ids=ids, attention_mask=torch.cat([g.prompt_mask,
                                                                g.completion_mask], 1)).logits
        P, T = g.prompt_ids.shape[1], g.completion_ids.shape[1]
        logp = F.log_softmax(logits[:, P - 1:P + T - 1].float() / 0.7, -1)  # (B, T, V)
        ent = -(logp.exp() * logp).sum(-1)  # (B, T)
        m = g.loss_mask.float()
        token_mean = ((ent * m).sum() / m.sum()).item()
    losses = {}
    for coef in (0.0, 0.5):
        cfg = replace(base, entropy_coef=coef)
        m_ = copy.deepcopy(model)
        opt = torch.optim.AdamW(m_.parameters(), lr=1e-3)
        losses[coef] = grpo.update(m_, opt, batch, cfg)
    assert losses[0.5]["losses/entropy"] == pytest.approx(token_mean, abs=1e-5)
    diff = losses[0.5]["losses/loss"] - losses[0.0]["losses/loss"]
    assert diff == pytest.approx(-0.5 * token_mean, abs=1e-5) and token_mean > 0.1
