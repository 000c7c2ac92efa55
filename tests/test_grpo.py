"""The GRPO family loss: hand-computed values, and equality with TRL's GRPOTrainer loss; the one
loop on single-turn completions (its multi-turn use is in test_lm_rollout.py)."""

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

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
    with pytest.raises(ValueError, match="needs ref_logps"):
        policy_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1),
                    GRPOConfig(beta=0.1))


# --- equality with TRL ---------------------------------------------------------------------------
def trl_loss(loss_type, logps, old_logps, ref_logps, advantages, mask, beta, eps, eps_high, max_len):
    """Run TRL's own GRPOTrainer._compute_loss on our tensors (a stand-in object supplies the
    attributes it reads; its log-prob function returns our ``logps``)."""
    from trl import GRPOTrainer

    class Acc:
        num_processes, sync_gradients = 1, True
        gather = gather_for_metrics = staticmethod(lambda x: x)
        reduce = staticmethod(lambda x, reduction="sum": x)

    fake = SimpleNamespace(
        top_entropy_quantile=1.0, off_policy_mask_threshold=None, importance_sampling_level="token",
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


@pytest.mark.parametrize("trl_type,agg", [("grpo", "seq_mean"), ("bnpo", "token_mean"),
                                          ("dapo", "token_mean"), ("dr_grpo", "const_norm")])
@pytest.mark.parametrize("beta", [0.0, 0.04])
def test_loss_equals_trl(trl_type, agg, beta):
    pytest.importorskip("trl")
    g = torch.Generator().manual_seed(1)
    B, T = 6, 5
    logps = -torch.rand(B, T, generator=g, dtype=torch.float64)
    old = logps + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)  # ratios far from 1
    ref = logps + 0.2 * torch.randn(B, T, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, T, generator=g) < 0.7).long()
    mask[:, 0] = 1
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    cfg = GRPOConfig(loss_agg=agg, beta=beta, clip_eps=0.2, clip_eps_high=0.28)
    ours, _ = policy_loss(logps, old, adv, mask, cfg, ref, max_len=7)
    theirs = trl_loss(trl_type, logps, old, ref, adv, mask, beta, 0.2, 0.28, 7)
    assert torch.allclose(ours, theirs, atol=1e-12), (ours.item(), theirs.item())


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
